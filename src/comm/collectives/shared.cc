// The building blocks of the `shared` algorithms (allreduce, reduce_scatter, allgather), which
// work on the buffers of one host's ranks where they lie, in memory from alloc_shared: the
// handshake that finds every rank's buffers (or finds that some lie elsewhere, the same on every
// rank), and the closing exchange that keeps each rank in the call until no peer still reads or
// writes its buffers.
#include <vector>

#include "collectives.h"

namespace cohort::comm::detail {

namespace {

// Where a rank's buffers of a call lie: the allocation and the offset in it; kNotShared for
// ordinary memory (or, for a receive buffer the algorithm does not share, not asked).
struct SharedPlace {
  static constexpr uint64_t kNotShared = ~uint64_t{0};
  uint64_t send_region = kNotShared, send_offset = 0;
  uint64_t recv_region = kNotShared, recv_offset = 0;
};

// A short message to every other rank of the group, and one from each (theirs[i] from group
// rank i).
void tell_everyone(Engine& e, const Call& c, const Group& g, const void* mine, void* theirs,
                   size_t bytes) {
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int i = 0; i < g.size(); ++i) {
    if (i == g.me) continue;
    sends.push_back({g.at(i), mine, bytes});
    recvs.push_back(
        {g.at(i), static_cast<uint8_t*>(theirs) + static_cast<size_t>(i) * bytes, bytes});
  }
  e.exchange(c, sends, recvs);
}

}  // namespace

bool shared_view(Engine& e, const Call& c, const Group& g, const void* send, size_t send_bytes,
                 void* recv, size_t recv_bytes, SharedView* v) {
  const bool need_recv = recv_bytes > 0;
  SharedPlace mine;
  size_t off = 0;
  if ((v->send_region = e.shared().find(e.rank(), send, send_bytes, &off))) {
    mine.send_region = v->send_region->id;
    mine.send_offset = off;
  }
  if (need_recv && (v->recv_region = e.shared().find(e.rank(), recv, recv_bytes, &off))) {
    mine.recv_region = v->recv_region->id;
    mine.recv_offset = off;
  }
  const size_t n = static_cast<size_t>(g.size());
  std::vector<SharedPlace> place(n);
  tell_everyone(e, c, g, &mine, place.data(), sizeof(SharedPlace));
  place[static_cast<size_t>(g.me)] = mine;
  for (const SharedPlace& p : place) {
    if (p.send_region == SharedPlace::kNotShared || p.send_region != mine.send_region) return false;
    if (need_recv &&
        (p.recv_region == SharedPlace::kNotShared || p.recv_region != mine.recv_region)) {
      return false;
    }
  }
  // Every rank's buffers lie in the same allocations, which this rank holds (its own buffers
  // lie in them), with every peer's part mapped.
  v->send.resize(n);
  v->recv.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const size_t r = static_cast<size_t>(g.at(static_cast<int>(i)));
    v->send[i] = v->send_region->at[r] + place[i].send_offset;
    if (need_recv) v->recv[i] = v->recv_region->at[r] + place[i].recv_offset;
  }
  return true;
}

void shared_done(Engine& e, const Call& c, const Group& g) {
  std::vector<uint8_t> token(static_cast<size_t>(g.size()));
  const uint8_t done = 1;
  tell_everyone(e, c, g, &done, token.data(), 1);
}

}  // namespace cohort::comm::detail
