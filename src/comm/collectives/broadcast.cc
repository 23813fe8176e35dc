// broadcast: binomial tree for small messages; scatter then ring allgather (van de Geijn)
// for large ones, which moves 2(n-1)/n of the data per rank instead of log2(n) times all of it.
#include <cstring>

#include "cohort/core/error.h"
#include "collectives.h"

namespace cohort::comm::detail {

void tree_broadcast(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t bytes,
                    int root_index) {
  const int n = g.size();
  if (n == 1) return;
  const int vr = (g.me - root_index + n) % n;
  auto real = [&](int v) { return g.at((v + root_index) % n); };
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      e.exchange(c, {}, {{real(vr - mask), buf, bytes}});
      break;
    }
    mask <<= 1;
  }
  std::vector<SendOp> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) sends.push_back({real(vr + mask), buf, bytes});
  }
  if (!sends.empty()) e.exchange(c, sends, {});
}

void broadcast(Engine& e, const Call& c) {
  const void* in = c.send;
  auto* out = static_cast<uint8_t*>(c.recv);
  const size_t count = c.count();
  const int root = c.root();
  const size_t es = c.esize(), bytes = count * es;
  if (e.rank() == root && in != out) std::memmove(out, in, bytes);
  const Group& g = e.natural();
  const int n = g.size();
  if (c.algo == Algo::ring) {
    // Scatter: the root sends block i to rank i; then every rank rings its block around.
    if (e.rank() == root) {
      std::vector<SendOp> sends;
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        sends.push_back({i, out + block_offset(count, n, i) * es, block_count(count, n, i) * es});
      }
      e.exchange(c, sends, {});
    } else {
      const int me = e.rank();
      e.exchange(c, {},
                 {{root, out + block_offset(count, n, me) * es, block_count(count, n, me) * es}});
    }
    ring_allgather(e, c, g, out, count, g.me);
    return;
  }
  tree_broadcast(e, c, g, out, bytes, root);
}

}  // namespace cohort::comm::detail
