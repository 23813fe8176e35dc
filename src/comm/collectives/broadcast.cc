// broadcast: binomial tree for small messages; scatter then ring allgather (van de Geijn)
// for large ones, which moves 2(n-1)/n of the data per rank instead of log2(n) times all of it.
#include <cstring>

#include "../engine.h"
#include "cohort/core/error.h"

namespace cohort::comm::detail {

void tree_broadcast(Engine& e, const Group& g, uint8_t* buf, size_t bytes, int root_index) {
  const int n = g.size();
  if (n == 1) return;
  const int vr = (g.me - root_index + n) % n;
  auto real = [&](int v) { return g.at((v + root_index) % n); };
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      e.exchange({}, {{real(vr - mask), buf, bytes}});
      break;
    }
    mask <<= 1;
  }
  std::vector<SendOp> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) sends.push_back({real(vr + mask), buf, bytes});
  }
  if (!sends.empty()) e.exchange(sends, {});
}

void broadcast(Engine& e, const void* in, void* out_v, size_t count, int root, Algo algo) {
  auto* out = static_cast<uint8_t*>(out_v);
  const size_t es = e.esize(), bytes = count * es;
  if (e.rank() == root && in != out) std::memmove(out, in, bytes);
  if (algo == Algo::automatic) algo = e.pick(Collective::broadcast, bytes);
  const Group& g = e.natural();
  const int n = g.size();
  if (algo == Algo::ring && n > 2) {
    // Scatter: the root sends block i to rank i; then every rank rings its block around.
    if (e.rank() == root) {
      std::vector<SendOp> sends;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        sends.push_back({i, out + block_offset(count, n, i) * es, block_count(count, n, i) * es});
      }
      e.exchange(sends, {});
    } else {
      const int me = e.rank();
      e.exchange({},
                 {{root, out + block_offset(count, n, me) * es, block_count(count, n, me) * es}});
    }
    ring_allgather(e, g, out, count, g.me);
    return;
  }
  if (algo != Algo::tree && algo != Algo::ring) {
    COHORT_THROW("broadcast has no algorithm '" << algo_name(algo) << "'");
  }
  tree_broadcast(e, g, out, bytes, root);
}

}  // namespace cohort::comm::detail
