// The engine the collective algorithms run on: this rank's links to every peer, the group
// shapes derived from the topology, scratch memory, and one primitive, `exchange` (a set of
// concurrent sends and receives, optionally reducing on arrival), which frames every message
// with its call's header and checks the peer's. The communicator owns one engine and hands it,
// with each call, to the algorithm; the engine knows nothing of queues, Work or the store.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "call.h"
#include "cohort/comm/cost_model.h"
#include "cohort/core/clock.h"
#include "links.h"
#include "settings.h"
#include "shared_memory.h"

namespace cohort::comm::detail {

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

// Payloads of at most this many bytes travel in one piece with their header: they are copied
// out when an exchange starts, so their buffer may also be a receive destination of the same
// exchange, the peer sees them complete in a single ring update, and over TCP each side pays
// one system call where a header and a payload apart cost two. 2 ranks over TCP loopback,
// blocking: a 4 KiB allreduce took 15.4-16.0 us at 4096 against 25.7-29.1 at 2048.
inline constexpr size_t kInlineBytes = 4096;

class Engine {
 public:
  Engine(int rank, Topology topo, LinkSet links, const Settings& s);
  ~Engine();

  int rank() const { return rank_; }
  int size() const { return topo_.world; }
  const Topology& topology() const { return topo_; }
  const Settings& settings() const { return settings_; }
  // Groups are computed once: the topology does not change during a communicator's life.
  const Group& world() const { return world_; }      // by (host, rank): rings cross hosts least
  const Group& natural() const { return natural_; }  // by rank
  const Group& local() const { return local_; }      // this host's ranks
  const Group& cross() const { return cross_; }      // this local index, one rank per host
  // This host's memory from alloc_shared, for the algorithms that read it where it lies.
  SharedRegions& shared() { return shared_; }
  const SharedRegions& shared() const { return shared_; }
  // Scratch memory reused across calls; slot selects independent buffers.
  void* scratch(size_t bytes, int slot);

  // A list of point-to-point operations of call `c`, without a heap allocation for the common
  // short ones.
  void exchange(const Call& c, std::initializer_list<SendOp> sends,
                std::initializer_list<RecvOp> recvs) {
    exchange_n(c, sends.begin(), sends.size(), recvs.begin(), recvs.size());
  }
  void exchange(const Call& c, const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) {
    exchange_n(c, sends.data(), sends.size(), recvs.data(), recvs.size());
  }
  void exchange_n(const Call& c, const SendOp* sends, size_t ns, const RecvOp* recvs, size_t nr);

  // The link figures the cost model uses (after the probe measured them).
  void set_link_figures(LinkModel shm, LinkModel net);
  // Every lane to `peer` (empty for this rank), for reports.
  const std::vector<std::unique_ptr<Link>>& lanes(int peer) const {
    return links_.lanes[static_cast<size_t>(peer)];
  }

  // Told the peers a waiting exchange still waits on, when that set changes ({} when it ends).
  // The flight recorder listens; the engine knows nothing more of it.
  void set_wait_observer(std::function<void(const std::vector<int>&)> f) {
    wait_observer_ = std::move(f);
  }
  // Asked, once a wait has lasted the heartbeat timeout, whether a waited-on peer is silent
  // (stopped or frozen): a non-empty answer fails the call with it.
  void set_silence_check(std::function<std::string(const std::vector<int>&)> f) {
    silence_check_ = std::move(f);
  }

  // Failure: after abort() every exchange fails at its next idle check, and every link tells
  // its peer `message`, so that the peers' waits fail promptly too.
  void abort(const std::string& reason, const std::string& message);
  void abort_links(const std::string& message);
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;

 private:
  void build_groups();
  void check_while_idle(const CollDesc& d, Clock::time_point idle_since);
  std::vector<Link*> links_of(int peer) const;  // every lane and the eager link
  [[noreturn]] void mismatch(const CollDesc& d, int peer, const wire::MsgHeader& h);

  int rank_;
  Topology topo_;
  LinkSet links_;
  Settings settings_;
  Group natural_, world_, local_, cross_;
  std::vector<std::vector<uint8_t>> scratch_;
  SharedRegions shared_;
  std::function<void(const std::vector<int>&)> wait_observer_;
  std::function<std::string(const std::vector<int>&)> silence_check_;
  std::vector<int> waiting_on_;  // what the observer was told last
  std::vector<int> waiting_scratch_;
  struct Transfer;
  std::vector<Transfer> xfers_;  // reused by exchange() so that small calls do not allocate
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string abort_reason_;  // guarded by mu_
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

}  // namespace cohort::comm::detail
