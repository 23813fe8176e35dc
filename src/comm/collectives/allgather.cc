// allgather: ring, or recursive doubling when the group is a power of two (fewer steps).
#include <cstring>

#include "../engine.h"
#include "cohort/core/error.h"

namespace cohort::comm::detail {

void allgather(Engine& e, const void* in, void* out_v, size_t count, Algo algo) {
  auto* out = static_cast<uint8_t*>(out_v);
  const size_t es = e.esize(), bytes = count * es;
  const int n = e.size(), me = e.rank();
  uint8_t* mine = out + static_cast<size_t>(me) * bytes;
  if (in != mine) std::memmove(mine, in, bytes);
  if (n == 1) return;
  if (algo == Algo::automatic) algo = e.pick(Collective::allgather, bytes * n);
  const Group& g = e.natural();  // blocks are ordered by rank
  if (algo == Algo::recursive_doubling && (n & (n - 1)) == 0) {
    int lo = me;
    for (int d = 1; d < n; d *= 2) {
      const int partner = me ^ d;
      const int plo = lo ^ d;
      e.exchange(
          {{partner, out + static_cast<size_t>(lo) * bytes, static_cast<size_t>(d) * bytes}},
          {{partner, out + static_cast<size_t>(plo) * bytes, static_cast<size_t>(d) * bytes}});
      lo = std::min(lo, plo);
    }
    return;
  }
  if (algo != Algo::ring && algo != Algo::recursive_doubling) {
    COHORT_THROW("allgather has no algorithm '" << algo_name(algo) << "'");
  }
  ring_allgather(e, g, out, count * static_cast<size_t>(n), g.me);
}

}  // namespace cohort::comm::detail
