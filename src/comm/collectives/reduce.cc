// reduce: binomial tree for small messages; ring reduce-scatter then gather to the root for
// large ones.
#include <cstring>

#include "../engine.h"
#include "cohort/comm/reduce.h"
#include "cohort/core/error.h"

namespace cohort::comm::detail {

void tree_reduce(Engine& e, const Group& g, const uint8_t* in, uint8_t* out, size_t count,
                 int root_index) {
  const int n = g.size();
  const size_t bytes = count * e.esize();
  uint8_t* acc = g.me == root_index ? out : static_cast<uint8_t*>(e.scratch(bytes, 1));
  if (acc != in) std::memmove(acc, in, bytes);
  const int vr = (g.me - root_index + n) % n;
  auto real = [&](int v) { return g.at((v + root_index) % n); };
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      e.exchange({{real(vr - mask), acc, bytes}}, {});
      break;
    }
    if (vr + mask < n) e.exchange({}, {{real(vr + mask), acc, bytes, acc}});
  }
}

void reduce(Engine& e, const void* in_v, void* out_v, size_t count, int root, Algo algo) {
  auto* in = static_cast<const uint8_t*>(in_v);
  auto* out = static_cast<uint8_t*>(out_v);
  const size_t es = e.esize(), bytes = count * es;
  if (algo == Algo::automatic) algo = e.pick(Collective::reduce, bytes);
  const Group& g = e.natural();
  const int n = g.size();
  if (algo == Algo::ring && n > 2) {
    uint8_t* tmp = e.rank() == root ? out : static_cast<uint8_t*>(e.scratch(bytes, 1));
    ring_reduce_scatter(e, g, in, tmp, count);
    // Rank i now owns block (i + 1) % n; the root collects them all.
    if (e.rank() == root) {
      std::vector<RecvOp> recvs;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        int b = (i + 1) % n;
        recvs.push_back({i, out + block_offset(count, n, b) * es, block_count(count, n, b) * es});
      }
      e.exchange({}, recvs);
    } else {
      int b = (e.rank() + 1) % n;
      e.exchange({{root, tmp + block_offset(count, n, b) * es, block_count(count, n, b) * es}}, {});
    }
  } else {
    if (algo != Algo::tree && algo != Algo::ring) {
      COHORT_THROW("reduce has no algorithm '" << algo_name(algo) << "'");
    }
    tree_reduce(e, g, in, out, count, root);
  }
  if (e.rank() == root && e.desc().op == RedOp::avg) divide(out, count, e.desc().dtype, e.size());
}

}  // namespace cohort::comm::detail
