// The algorithms (one file per collective) and the building blocks they share. Each runs one
// call on the engine; the call carries its buffers, counts (in elements) and the algorithm
// chosen for it at issue, which the collective runs as given.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "../call.h"
#include "../engine.h"

namespace cohort::comm::detail {

// Runs call `c`: the one switch from a call's kind to its collective. Returns the algorithm
// that ran: the call's, except a `shared` one that found a rank's buffers outside shared memory
// and ran the ring.
Algo run(Engine& e, const Call& c);

Algo allreduce(Engine& e, const Call& c);
Algo reduce_scatter(Engine& e, const Call& c);
Algo allgather(Engine& e, const Call& c);
void broadcast(Engine& e, const Call& c);
void reduce(Engine& e, const Call& c);
void alltoall(Engine& e, const Call& c);
void gather(Engine& e, const Call& c);
void scatter(Engine& e, const Call& c);
void barrier(Engine& e, const Call& c);

// Building blocks shared by several collectives, over any group; element counts and types are
// those of call `c`.
// Ring reduce-scatter of `count` elements split into g.size() blocks: afterwards block
// (g.me + 1 - shift) % n of out is fully reduced. `in` may equal `out`.
void ring_reduce_scatter(Engine& e, const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                         size_t count, int shift = 0);
// Ring allgather of the blocks of buf; this rank starts holding block `have`.
void ring_allgather(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t count, int have);
// Step s (0 .. n-2) of each, as its one send and one receive, for schedules that run several
// rings at once (the pipelined hierarchical allreduce).
struct RingStep {
  SendOp send;
  RecvOp recv;
};
RingStep ring_reduce_scatter_step(const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                                  size_t count, int s, int shift = 0);
RingStep ring_allgather_step(const Call& c, const Group& g, uint8_t* buf, size_t count, int have,
                             int s);
void recursive_doubling_allreduce(Engine& e, const Call& c, const Group& g, uint8_t* buf,
                                  size_t count);
void rabenseifner_allreduce(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t count);
void tree_broadcast(Engine& e, const Call& c, const Group& g, uint8_t* buf, size_t bytes,
                    int root_index);
void tree_reduce(Engine& e, const Call& c, const Group& g, const uint8_t* in, uint8_t* out,
                 size_t count, int root_index);

// The `shared` algorithms' handshake (shared.cc): every rank of g tells the others where its
// send buffer (of send_bytes) and, when recv_bytes > 0, its receive buffer lie in alloc_shared
// memory. True when every rank's lie in the same allocations: then send[i] and recv[i] are group
// rank i's buffers as mapped here. False, on every rank alike, when any lies outside: the
// caller then runs its ring.
struct SharedView {
  std::vector<const uint8_t*> send;
  std::vector<uint8_t*> recv;
  std::shared_ptr<const SharedRegion> send_region, recv_region;  // held for the call
};
bool shared_view(Engine& e, const Call& c, const Group& g, const void* send, size_t send_bytes,
                 void* recv, size_t recv_bytes, SharedView* v);
// The closing exchange: returns once every rank of g is done with the others' buffers, so that
// none returns (and lets its caller change them) while a peer still reads or writes them.
void shared_done(Engine& e, const Call& c, const Group& g);
// Bytes a `shared` algorithm handles at a time: a piece stays in cache between its reads and
// its writes. (Pieces of 16-128 KiB ran alike.)
inline constexpr size_t kSharedPieceBytes = 32u << 10;

}  // namespace cohort::comm::detail
