// Ring reduce-scatter and allgather over any group: the bandwidth-optimal building blocks.
// Data arrive as a stream, so each block is reduced while it is still being received.
#include <cstring>

#include "collectives.h"

namespace cohort::comm::detail {

RingStep ring_reduce_scatter_step(const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                                  size_t count, int s, int shift) {
  const int n = g.size(), me = g.me;
  const size_t es = c.esize();
  const int sb = ((me - s - shift) % n + n) % n;
  const int rb = ((me - s - 1 - shift) % n + n) % n;
  const uint8_t* src = s == 0 ? in : out;
  const size_t so = block_offset(count, n, sb) * es, sl = block_count(count, n, sb) * es;
  const size_t ro = block_offset(count, n, rb) * es, rl = block_count(count, n, rb) * es;
  return {{g.at((me + 1) % n), src + so, sl}, {g.at((me - 1 + n) % n), out + ro, rl, in + ro}};
}

RingStep ring_allgather_step(const Call& c, const Group& g, uint8_t* buf, size_t count, int have,
                             int s) {
  const int n = g.size(), me = g.me;
  const size_t es = c.esize();
  const int sb = (have - s + n) % n;
  const int rb = (have - s - 1 + n) % n;
  const size_t so = block_offset(count, n, sb) * es, sl = block_count(count, n, sb) * es;
  const size_t ro = block_offset(count, n, rb) * es, rl = block_count(count, n, rb) * es;
  return {{g.at((me + 1) % n), buf + so, sl}, {g.at((me - 1 + n) % n), buf + ro, rl}};
}

void ring_reduce_scatter(Engine& e, const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                         size_t count, int shift) {
  if (g.size() == 1) {
    if (in != out) std::memcpy(out, in, count * c.esize());
    return;
  }
  for (int s = 0; s < g.size() - 1; ++s) {
    const RingStep st = ring_reduce_scatter_step(c, g, in, out, count, s, shift);
    e.exchange(c, {st.send}, {st.recv});
  }
}

void ring_allgather(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t count,
                    int have) {
  for (int s = 0; s < g.size() - 1; ++s) {
    const RingStep st = ring_allgather_step(c, g, buf, count, have, s);
    e.exchange(c, {st.send}, {st.recv});
  }
}

}  // namespace cohort::comm::detail
