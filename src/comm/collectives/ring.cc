// Ring reduce-scatter and allgather over any group: the bandwidth-optimal building blocks.
// Data arrive as a stream, so each block is reduced while it is still being received.
#include <cstring>

#include "../engine.h"

namespace cohort::comm::detail {

void ring_reduce_scatter(Engine& e, const Group& g, const uint8_t* in, uint8_t* out, size_t count,
                         int shift) {
  const int n = g.size();
  const size_t es = e.esize();
  if (n == 1) {
    if (in != out) std::memcpy(out, in, count * es);
    return;
  }
  const int me = g.me;
  const int next = g.at((me + 1) % n), prev = g.at((me - 1 + n) % n);
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((me - s - shift) % n + n) % n;
    const int rb = ((me - s - 1 - shift) % n + n) % n;
    const uint8_t* src = s == 0 ? in : out;
    const size_t so = block_offset(count, n, sb) * es, sl = block_count(count, n, sb) * es;
    const size_t ro = block_offset(count, n, rb) * es, rl = block_count(count, n, rb) * es;
    e.exchange({{next, src + so, sl}}, {{prev, out + ro, rl, in + ro}});
  }
}

void ring_allgather(Engine& e, const Group& g, uint8_t* buf, size_t count, int have) {
  const int n = g.size();
  if (n == 1) return;
  const size_t es = e.esize();
  const int me = g.me;
  const int next = g.at((me + 1) % n), prev = g.at((me - 1 + n) % n);
  for (int s = 0; s < n - 1; ++s) {
    const int sb = (have - s + n) % n;
    const int rb = (have - s - 1 + n) % n;
    const size_t so = block_offset(count, n, sb) * es, sl = block_count(count, n, sb) * es;
    const size_t ro = block_offset(count, n, rb) * es, rl = block_count(count, n, rb) * es;
    e.exchange({{next, buf + so, sl}}, {{prev, buf + ro, rl}});
  }
}

}  // namespace cohort::comm::detail
