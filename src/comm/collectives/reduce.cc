// reduce: binomial tree for small messages; ring reduce-scatter then gather to the root for
// large ones.
#include <cstring>

#include "cohort/core/error.h"
#include "collectives.h"
#include "reduce/reduce.h"

namespace cohort::comm::detail {

void tree_reduce(Engine& e, const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                 size_t count, int root_index) {
  const int n = g.size();
  const size_t bytes = count * c.esize();
  uint8_t* acc = g.me == root_index ? out : static_cast<uint8_t*>(e.scratch(bytes, 1));
  if (acc != in) std::memmove(acc, in, bytes);
  const int vr = (g.me - root_index + n) % n;
  auto real = [&](int v) { return g.at((v + root_index) % n); };
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      e.exchange(c, {{real(vr - mask), acc, bytes}}, {});
      break;
    }
    if (vr + mask < n) e.exchange(c, {}, {{real(vr + mask), acc, bytes, acc}});
  }
}

void reduce(Engine& e, const Call& c) {
  auto* in = static_cast<const uint8_t*>(c.send);
  auto* out = static_cast<uint8_t*>(c.recv);
  const size_t count = c.count();
  const int root = c.root();
  const size_t es = c.esize(), bytes = count * es;
  const Group& g = e.natural();
  const int n = g.size();
  if (c.algo == Algo::ring) {
    uint8_t* tmp = e.rank() == root ? out : static_cast<uint8_t*>(e.scratch(bytes, 1));
    ring_reduce_scatter(e, c, g, in, tmp, count);
    // Rank i now owns block (i + 1) % n; the root collects them all.
    if (e.rank() == root) {
      std::vector<RecvOp> recvs;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        int b = (i + 1) % n;
        recvs.push_back({i, out + block_offset(count, n, b) * es, block_count(count, n, b) * es});
      }
      e.exchange(c, {}, recvs);
    } else {
      int b = (e.rank() + 1) % n;
      e.exchange(c, {{root, tmp + block_offset(count, n, b) * es, block_count(count, n, b) * es}},
                 {});
    }
  } else {
    tree_reduce(e, c, g, in, out, count, root);
  }
  if (e.rank() == root && c.desc.op == RedOp::avg) divide(out, count, c.desc.dtype, e.size());
}

}  // namespace cohort::comm::detail
