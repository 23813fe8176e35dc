// reduce_scatter: ring, shifted by one block so that each rank ends owning its own block; or
// shared, where every rank's input lies in alloc_shared memory: each rank reduces its block
// straight from the peers' inputs.
#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"
#include "collectives.h"
#include "reduce/reduce.h"

namespace cohort::comm::detail {

namespace {

// Rank i reduces block i of every rank's input into its output, a piece at a time: each input
// block read once, no ring in between. The input of this rank may hold its output (in place).
bool shared_reduce_scatter(Engine& e, const Call& c, const uint8_t* in, uint8_t* out) {
  const Group& g = e.natural();  // block i belongs to rank i
  const int n = g.size(), me = g.me;
  const size_t es = c.esize(), bytes = c.count() * es;
  SharedView v;
  if (!shared_view(e, c, g, in, bytes * static_cast<size_t>(n), nullptr, 0, &v)) return false;
  const size_t lo = static_cast<size_t>(me) * bytes;
  const size_t piece = std::max<size_t>(es, kSharedPieceBytes / es * es);
  const int other = me == 0 ? 1 : 0;
  for (size_t o = 0; o < bytes; o += piece) {
    const size_t k = std::min(piece, bytes - o) / es;
    c.reduce_into(out + o, v.send[static_cast<size_t>(me)] + lo + o,
                  v.send[static_cast<size_t>(other)] + lo + o, k);
    for (int i = 0; i < n; ++i) {
      if (i != me && i != other) {
        c.reduce_into(out + o, out + o, v.send[static_cast<size_t>(i)] + lo + o, k);
      }
    }
  }
  shared_done(e, c, g);
  return true;
}

}  // namespace

Algo reduce_scatter(Engine& e, const Call& c) {
  auto* in = static_cast<const uint8_t*>(c.send);
  auto* out = static_cast<uint8_t*>(c.recv);
  const size_t count = c.count();
  const int n = e.size();
  const size_t bytes = count * c.esize();
  const Group& g = e.natural();  // block i belongs to rank i
  Algo ran = c.algo;
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
  } else if (c.algo != Algo::shared || !shared_reduce_scatter(e, c, in, out)) {
    auto* tmp = static_cast<uint8_t*>(e.scratch(bytes * static_cast<size_t>(n), 1));
    ring_reduce_scatter(e, c, g, in, tmp, count * static_cast<size_t>(n), 1);
    std::memcpy(out, tmp + static_cast<size_t>(g.me) * bytes, bytes);
    ran = Algo::ring;
  }
  if (c.desc.op == RedOp::avg) divide(out, count, c.desc.dtype, n);
  return ran;
}

}  // namespace cohort::comm::detail
