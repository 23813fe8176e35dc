// allreduce: ring (bandwidth), recursive doubling (latency), Rabenseifner's halving-doubling
// (both), hierarchical (inside hosts over shared memory, across hosts over the network), and
// shared (one host's ranks working on each other's buffers where they lie).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cohort/core/bits.h"
#include "cohort/core/error.h"
#include "collectives.h"
#include "reduce/reduce.h"

namespace cohort::comm::detail {

namespace {

// Non-power-of-two groups fold the first 2*rem ranks in pairs (even into odd) so that a
// power-of-two core runs the algorithm; returns this rank's index in the core or -1.
int fold_in(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t bytes, int p) {
  const int rem = g.size() - p, i = g.me;
  if (i < 2 * rem) {
    if (i % 2 == 0) {
      e.exchange(c, {{g.at(i + 1), buf, bytes}}, {});
      return -1;
    }
    e.exchange(c, {}, {{g.at(i - 1), buf, bytes, buf}});
    return i / 2;
  }
  return i - rem;
}

void fold_out(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t bytes, int p) {
  const int rem = g.size() - p, i = g.me;
  if (i < 2 * rem) {
    if (i % 2 == 0) {
      e.exchange(c, {}, {{g.at(i + 1), buf, bytes}});
    } else {
      e.exchange(c, {{g.at(i - 1), buf, bytes}}, {});
    }
  }
}

int core_rank(const Group& g, int p, int ni) {
  const int rem = g.size() - p;
  return g.at(ni < rem ? ni * 2 + 1 : ni + rem);
}

}  // namespace

void recursive_doubling_allreduce(Engine& e, const Call& c, const Group& g, uint8_t* buf,
                                  size_t count) {
  const size_t bytes = count * c.esize();
  if (g.size() == 1) return;
  const int p = pow2_floor(g.size());
  const int ni = fold_in(e, c, g, buf, bytes, p);
  if (ni >= 0) {
    for (int d = 1; d < p; d *= 2) {
      const int partner = core_rank(g, p, ni ^ d);
      if (bytes <= kInlineBytes) {
        // The send is staged before anything arrives: reduce straight into buf.
        e.exchange(c, {{partner, buf, bytes}}, {{partner, buf, bytes, buf}});
      } else {
        // The send reads buf while the partner's data arrive: receive into scratch.
        auto* tmp = static_cast<uint8_t*>(e.scratch(bytes, 0));
        e.exchange(c, {{partner, buf, bytes}}, {{partner, tmp, bytes}});
        c.reduce_into(buf, buf, tmp, count);
      }
    }
  }
  fold_out(e, c, g, buf, bytes, p);
}

void rabenseifner_allreduce(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t count) {
  const size_t es = c.esize();
  if (g.size() == 1) return;
  const int p = pow2_floor(g.size());
  const int ni = fold_in(e, c, g, buf, count * es, p);
  if (ni >= 0) {
    auto off = [&](int blk) { return block_offset(count, p, blk) * es; };
    int lo = 0, hi = p;
    for (int d = p / 2; d >= 1; d /= 2) {  // recursive halving: reduce-scatter
      const int partner = core_rank(g, p, ni ^ d);
      const int mid = lo + d;
      int keep_lo = lo, keep_hi = mid, send_lo = mid, send_hi = hi;
      if (ni & d) std::swap(keep_lo, send_lo), std::swap(keep_hi, send_hi);
      e.exchange(c, {{partner, buf + off(send_lo), off(send_hi) - off(send_lo)}},
                 {{partner, buf + off(keep_lo), off(keep_hi) - off(keep_lo), buf + off(keep_lo)}});
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int d = 1; d < p; d *= 2) {  // recursive doubling: allgather
      const int partner = core_rank(g, p, ni ^ d);
      const int plo = lo ^ d;
      e.exchange(c, {{partner, buf + off(lo), off(lo + d) - off(lo)}},
                 {{partner, buf + off(plo), off(plo + d) - off(plo)}});
      lo = std::min(lo, plo);
    }
  }
  fold_out(e, c, g, buf, count * es, p);
}

// The hierarchical allreduce in chunks, as a software pipeline: while chunk k crosses between
// hosts, chunk k+1 is reduced inside each host and chunk k-1 shared inside it, so the links
// between hosts stay busy from the first chunk to the last instead of idling during the two
// shared-memory phases. Each chunk runs the same steps as the unpipelined algorithm (local ring
// reduce-scatter, ring reduce-scatter and allgather across hosts of this rank's block, local
// ring allgather); at tick t, chunk k runs its step t - k, so the steps of one exchange touch
// disjoint chunks, and every rank adds them in the same order, which keeps each link's stream
// of messages the same on both ends. Chunks of about kHierChunkBytes (COHORT_HIER_CHUNK): small
// enough that filling and draining the pipeline costs little, large enough that each step's
// messages keep a network link at full rate.
void pipelined_hierarchical_allreduce(Engine& e, const Call& c, const uint8_t* in, uint8_t* out,
                                      size_t count) {
  const Group& lg = e.local();
  const Group& cg = e.cross();
  const int L = lg.size(), H = cg.size();
  const size_t es = c.esize();
  const size_t chunk_bytes = e.settings().hier_chunk;
  const int chunks = static_cast<int>(
      std::clamp<size_t>(count * es / std::max<size_t>(chunk_bytes, 1), 1, kHierMaxChunks));
  const int steps = 2 * (L - 1) + 2 * (H - 1);
  const int blk = (lg.me + 1) % L;  // the block of each chunk this rank reduces across hosts
  // With one rank per host there is no local reduce-scatter to bring `in` into `out`.
  if (L == 1 && in != out) std::memcpy(out, in, count * es);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int t = 0; t < chunks + steps - 1; ++t) {
    sends.clear();
    recvs.clear();
    for (int k = std::max(0, t - steps + 1); k <= std::min(chunks - 1, t); ++k) {
      const size_t off = block_offset(count, chunks, k) * es, n = block_count(count, chunks, k);
      uint8_t* part = out + off + block_offset(n, L, blk) * es;
      const size_t pn = block_count(n, L, blk);
      int s = t - k;
      RingStep st;
      if (s < L - 1) {
        st = ring_reduce_scatter_step(c, lg, in + off, out + off, n, s);
      } else if ((s -= L - 1) < H - 1) {
        st = ring_reduce_scatter_step(c, cg, part, part, pn, s);
      } else if ((s -= H - 1) < H - 1) {
        st = ring_allgather_step(c, cg, part, pn, (cg.me + 1) % H, s);
      } else {
        st = ring_allgather_step(c, lg, out + off, n, blk, s - (H - 1));
      }
      sends.push_back(st.send);
      recvs.push_back(st.recv);
    }
    e.exchange(c, sends, recvs);
  }
}

namespace {

// The ring allreduce. Large buffers go round the ring in slices, so that what the allgather
// sends was reduced moments ago and is still in cache instead of being read back from memory.
void ring_allreduce(Engine& e, const Call& c, const uint8_t* in, uint8_t* out, size_t count) {
  const Group& g = e.world();
  const size_t slice_bytes = e.settings().ring_slice;
  const size_t per = std::max<size_t>(1, slice_bytes / c.esize()) * g.size();
  for (size_t off = 0; off < count || off == 0; off += per) {
    const size_t n = std::min(per, count - off);
    const size_t b = off * c.esize();
    ring_reduce_scatter(e, c, g, in + b, out + b, n);
    ring_allgather(e, c, g, out + b, n, (g.me + 1) % g.size());
    if (count == 0) break;
  }
}

// The allreduce that works on the peers' buffers where they lie, on one host whose ranks map
// each other's memory (alloc_shared). Rank i reduces block i of every rank's input, a piece at
// a time, and writes each piece, still in cache, into every rank's output. Each input is read
// once and each output written once, where the ring through shared memory copies every byte
// into a ring and out of it twice. Two short exchanges order it: the places (every input is
// ready) and "done" (every output is written, and no rank returns while a peer still reads
// its input). Where any rank's buffers lie outside shared memory, every rank sees so in the
// places and all run the ring instead.
// 64 MiB f32 on 2 ranks: 13.2-13.9 GB/s, the ring 7.2-7.7; 1 MiB: 22-29 against 8-10. Reducing
// into one's own output and then copying the other blocks out of the peers' outputs read every
// result twice from memory: 9.2-10.4 GB/s at 64 MiB. Non-temporal stores into the peers'
// outputs gained nothing at 64-256 MiB and lost at 256 KiB-4 MiB.
Algo shared_allreduce(Engine& e, const Call& c, const uint8_t* in, uint8_t* out, size_t count) {
  const Group& g = e.natural();
  const int n = g.size(), me = g.me;
  const size_t es = c.esize(), bytes = count * es;
  SharedView v;
  if (!shared_view(e, c, g, in, bytes, out, bytes, &v)) {
    ring_allreduce(e, c, in, out, count);
    return Algo::ring;
  }
  auto input = [&](int i) { return v.send[static_cast<size_t>(i)]; };
  auto output = [&](int i) { return v.recv[static_cast<size_t>(i)]; };
  // In place, a rank's output is its input: each piece is read from every input before it is
  // written to any output (this rank's own input first, as its output takes the first result),
  // and only this rank touches this block.
  const size_t lo = block_offset(count, n, me) * es, len = block_count(count, n, me) * es;
  const size_t piece = std::max<size_t>(es, kSharedPieceBytes / es * es);
  for (size_t o = lo; o < lo + len; o += piece) {
    const size_t k = std::min(piece, lo + len - o) / es;
    const int other = me == 0 ? 1 : 0;
    c.reduce_into(out + o, input(me) + o, input(other) + o, k);
    for (int i = 0; i < n; ++i) {
      if (i != me && i != other) c.reduce_into(out + o, out + o, input(i) + o, k);
    }
    for (int i = 0; i < n; ++i) {
      if (i != me) std::memcpy(output(i) + o, out + o, k * es);
    }
  }
  shared_done(e, c, g);
  return Algo::shared;
}

}  // namespace

Algo allreduce(Engine& e, const Call& c) {
  auto* in = static_cast<const uint8_t*>(c.send);
  auto* out = static_cast<uint8_t*>(c.recv);
  const size_t count = c.count();
  const size_t bytes = count * c.esize();
  Algo ran = c.algo;
  switch (c.algo) {
    case Algo::ring:
      ring_allreduce(e, c, in, out, count);
      break;
    case Algo::shared:
      ran = shared_allreduce(e, c, in, out, count);
      break;
    case Algo::hierarchical:
      if (bytes >= kHierPipelineMinBytes) {
        pipelined_hierarchical_allreduce(e, c, in, out, count);
        break;
      }
      {
        const Group& lg = e.local();
        const Group& cg = e.cross();
        ring_reduce_scatter(e, c, lg, in, out, count);
        const int blk = (lg.me + 1) % lg.size();
        const size_t bo = block_offset(count, lg.size(), blk),
                     bc = block_count(count, lg.size(), blk);
        const size_t bb = bc * c.esize();
        uint8_t* part = out + bo * c.esize();
        // Across hosts every local rank moves its own 1/L of the data at once.
        Topology across = Topology::uniform(cg.size(), 1);
        across.net = e.topology().net;
        if (choose(Collective::allreduce, across, bb) == Algo::ring) {
          ring_reduce_scatter(e, c, cg, part, part, bc);
          ring_allgather(e, c, cg, part, bc, (cg.me + 1) % cg.size());
        } else {
          recursive_doubling_allreduce(e, c, cg, part, bc);
        }
        ring_allgather(e, c, lg, out, count, blk);
      }
      break;
    case Algo::recursive_doubling:
      if (in != out) std::memcpy(out, in, bytes);
      recursive_doubling_allreduce(e, c, e.world(), out, count);
      break;
    case Algo::rabenseifner:
      if (in != out) std::memcpy(out, in, bytes);
      rabenseifner_allreduce(e, c, e.world(), out, count);
      break;
    default:  // choose_algorithm offers allreduce nothing else
      COHORT_THROW("allreduce cannot run '" << algo_name(c.algo) << "'");
  }
  if (c.desc.op == RedOp::avg) divide(out, count, c.desc.dtype, e.size());
  return ran;
}

}  // namespace cohort::comm::detail
