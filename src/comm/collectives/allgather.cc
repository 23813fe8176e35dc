// allgather: ring, or recursive doubling when the group is a power of two (fewer steps), or
// shared, where every rank's input lies in alloc_shared memory: each rank copies the peers'
// inputs straight into its output.
#include <cstring>

#include "cohort/core/error.h"
#include "collectives.h"

namespace cohort::comm::detail {

Algo allgather(Engine& e, const Call& c) {
  const void* in = c.send;
  auto* out = static_cast<uint8_t*>(c.recv);
  const size_t count = c.count();
  const size_t es = c.esize(), bytes = count * es;
  const int n = e.size(), me = e.rank();
  uint8_t* mine = out + static_cast<size_t>(me) * bytes;
  if (in != mine) std::memmove(mine, in, bytes);
  if (n == 1) return c.algo;
  const Group& g = e.natural();  // blocks are ordered by rank
  if (c.algo == Algo::shared) {
    // One copy per block, from where the peer's input lies (which may be the peer's own block
    // of its output: in place, the peer writes only the other blocks).
    SharedView v;
    if (shared_view(e, c, g, in, bytes, nullptr, 0, &v)) {
      for (int i = 0; i < n; ++i) {
        if (i != me)
          std::memcpy(out + static_cast<size_t>(i) * bytes, v.send[static_cast<size_t>(i)], bytes);
      }
      shared_done(e, c, g);
      return Algo::shared;
    }
    ring_allgather(e, c, g, out, count * static_cast<size_t>(n), g.me);
    return Algo::ring;
  }
  if (c.algo == Algo::recursive_doubling) {  // a power-of-two group (choose_algorithm)
    int lo = me;
    for (int d = 1; d < n; d *= 2) {
      const int partner = me ^ d;
      const int plo = lo ^ d;
      e.exchange(
          c, {{partner, out + static_cast<size_t>(lo) * bytes, static_cast<size_t>(d) * bytes}},
          {{partner, out + static_cast<size_t>(plo) * bytes, static_cast<size_t>(d) * bytes}});
      lo = std::min(lo, plo);
    }
    return c.algo;
  }
  ring_allgather(e, c, g, out, count * static_cast<size_t>(n), g.me);
  return c.algo;
}

}  // namespace cohort::comm::detail
