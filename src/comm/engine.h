// The engine the collective algorithms are written against: ranks grouped into Groups,
// one `exchange` primitive (a set of concurrent sends and receives, optionally reducing on
// arrival), and the description of the collective in flight, which rides in every message
// header so that mismatched calls are caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/comm/cost_model.h"
#include "cohort/comm/types.h"
#include "cohort/comm/wire.h"

namespace cohort::comm::detail {

using Coll = Collective;

struct CollDesc {
  Coll coll = Coll::barrier;
  DataType dtype = DataType::u8;
  RedOp op = RedOp::sum;
  uint32_t seq = 0;
  uint32_t root = 0;
  uint64_t count = 0;
  std::string str() const;

  // The header in front of each message of this call, and back.
  wire::MsgHeader header(uint64_t payload_bytes) const;
  static CollDesc of(const wire::MsgHeader& h);
  // Whether a peer's header belongs to this very call (point-to-point ignores op and root).
  bool matches(const wire::MsgHeader& h) const;
};

// An ordered subset of the communicator's ranks (rings and trees run over groups).
struct Group {
  std::vector<int> ranks;
  int me = 0;  // this rank's index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
  int at(int i) const { return ranks[static_cast<size_t>(i)]; }
};

struct SendOp {
  int peer;
  const void* data;
  size_t bytes;
};

struct RecvOp {
  int peer;
  void* dst;
  size_t bytes;
  const void* local = nullptr;  // if set: dst = local (op) incoming, elementwise
};

// Sends of at most this many bytes are copied out when an exchange starts, so their buffer may
// also be a receive destination of the same exchange.
inline constexpr size_t kStagedSendBytes = 2048;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CollDesc& desc() const = 0;
  virtual const Topology& topology() const = 0;
  // Scratch memory owned by the engine, reused across calls; slot selects independent buffers.
  virtual void* scratch(size_t bytes, int slot) = 0;

  size_t esize() const { return dtype_size(desc().dtype); }
  void reduce_into(void* dst, const void* a, const void* b, size_t count) const;
  // Groups are computed once (build_groups): the topology does not change during a
  // communicator's life.
  const Group& world() const { return world_; }      // by (host, rank): rings cross hosts least
  const Group& natural() const { return natural_; }  // by rank
  const Group& local() const { return local_; }      // this host's ranks
  const Group& cross() const { return cross_; }      // this local index, one rank per host
  bool hosts_uniform() const;                        // every host has the same number of ranks
  // The cost model's choice for this communicator, remembered per (collective, size).
  Algo pick(Collective c, size_t bytes) const;

  // A list of point-to-point operations without a heap allocation for the common short ones.
  void exchange(std::initializer_list<SendOp> sends, std::initializer_list<RecvOp> recvs) {
    exchange_n(sends.begin(), sends.size(), recvs.begin(), recvs.size());
  }
  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) {
    exchange_n(sends.data(), sends.size(), recvs.data(), recvs.size());
  }
  virtual void exchange_n(const SendOp* sends, size_t ns, const RecvOp* recvs, size_t nr) = 0;

 protected:
  void build_groups();  // once the implementation knows its rank, size and topology
  void forget_picks() { picks_.clear(); }  // after the topology's figures change

 private:
  Group natural_, world_, local_, cross_;
  mutable std::unordered_map<uint64_t, Algo> picks_;
};

// Partition of count elements into n nearly equal blocks (the first count % n get one more).
inline size_t block_offset(size_t count, int n, int i) {
  size_t q = count / static_cast<size_t>(n), r = count % static_cast<size_t>(n);
  size_t ii = static_cast<size_t>(i);
  return ii * q + std::min(ii, r);
}
inline size_t block_count(size_t count, int n, int i) {
  return block_offset(count, n, i + 1) - block_offset(count, n, i);
}

// Algorithms (collectives/*.cc). Buffers are byte pointers; counts are elements.
void allreduce(Engine& e, const void* in, void* out, size_t count, Algo algo);
void reduce_scatter(Engine& e, const void* in, void* out, size_t count, Algo algo);
void allgather(Engine& e, const void* in, void* out, size_t count, Algo algo);
void broadcast(Engine& e, const void* in, void* out, size_t count, int root, Algo algo);
void reduce(Engine& e, const void* in, void* out, size_t count, int root, Algo algo);
void alltoall(Engine& e, const void* in, void* out, size_t count);
void gather(Engine& e, const void* in, void* out, size_t count, int root);
void scatter(Engine& e, const void* in, void* out, size_t count, int root);
void barrier(Engine& e);

// Building blocks shared by several collectives, over any group.
// Ring reduce-scatter of `count` elements split into g.size() blocks: afterwards block
// (g.me + 1 - shift) % n of out is fully reduced. `in` may equal `out`.
void ring_reduce_scatter(Engine& e, const Group& g, const uint8_t* in, uint8_t* out, size_t count,
                         int shift = 0);
// Ring allgather of the blocks of buf; this rank starts holding block `have`.
void ring_allgather(Engine& e, const Group& g, uint8_t* buf, size_t count, int have);
// Step s (0 .. n-2) of each, as its one send and one receive, for schedules that run several
// rings at once (the pipelined hierarchical allreduce).
struct RingStep {
  SendOp send;
  RecvOp recv;
};
RingStep ring_reduce_scatter_step(const Engine& e, const Group& g, const uint8_t* in, uint8_t* out,
                                  size_t count, int s, int shift = 0);
RingStep ring_allgather_step(const Engine& e, const Group& g, uint8_t* buf, size_t count, int have,
                             int s);
void recursive_doubling_allreduce(Engine& e, const Group& g, uint8_t* buf, size_t count);
void rabenseifner_allreduce(Engine& e, const Group& g, uint8_t* buf, size_t count);
void tree_broadcast(Engine& e, const Group& g, uint8_t* buf, size_t bytes, int root_index);
void tree_reduce(Engine& e, const Group& g, const uint8_t* in, uint8_t* out, size_t count,
                 int root_index);

}  // namespace cohort::comm::detail
