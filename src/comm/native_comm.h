// Cohort's own backend: the Communicator that users call. It owns the engine (links,
// exchange) and a queue of calls that run in issue order, one at a time, on the progress thread
// or on a caller blocked in Work::wait(). Each job has its own file:
//   native_comm.cc      construction (topology, links, engine, progress thread)
//   calls.cc            the API: arguments checked, algorithm chosen, call queued
//   queue.cc            the queue and the progress thread; running a call; failures
//   join.cc             joining the job through the store (init_world, init)
//   split.cc            split(color, key)
//   mailbox.cc          open_mailbox() and the Mailbox: tagged messages on links of their own
//   shutdown.cc         shutdown and lingering for peers when the job fails
//   topology_report.cc  describe() and the topology report
//   probe.cc            the link probe (COHORT_PROBE)
//   work.cc             Work and its state
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "algorithm.h"
#include "call.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/store.h"
#include "engine.h"
#include "flight_recorder.h"
#include "heartbeat.h"
#include "settings.h"
#include "transport/peer.h"

namespace cohort::comm {

class StoreServer;
namespace detail {
class NativeComm;
}

// What a Work handle waits on. `ready` is 0 until finished; waited on with C++20's atomic wait
// (a futex), which costs nothing at completion when nobody sleeps.
class WorkState {
 public:
  std::atomic<int> ready{0};
  std::weak_ptr<detail::NativeComm> owner;  // whose queue wait() may help to drain
  std::exception_ptr error;                 // written before `ready`
  // The algorithm chosen at issue, and why (static texts); once finished, the one that ran.
  std::atomic<const char*> algo{""};
  std::atomic<const char*> reason{""};
  std::atomic<int> source{-1};  // a Mailbox receive: the rank its message came from
};

namespace detail {

class NativeComm final : public Communicator, public std::enable_shared_from_this<NativeComm> {
 public:
  // Collective over `members` (global ranks of the parent job, in order); store is private to
  // this communicator.
  NativeComm(Store store, std::string token, std::string comm_name, int rank,
             std::vector<PeerDesc> members, Settings s);
  ~NativeComm() override;

  static std::shared_ptr<NativeComm> init_world(const JobEnv& env, Settings s);
  // The world through a store that exists already: agree on the size, claim the rank, publish
  // this process, wait for every rank. `server` (if any) is kept alive by the communicator.
  static std::shared_ptr<NativeComm> join_world(Store store, int rank, int world,
                                                const std::string& token, Settings s,
                                                std::unique_ptr<StoreServer> server);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int local_rank() const override { return engine_->local().me; }
  int local_size() const override { return engine_->local().size(); }
  int num_hosts() const override { return engine_->topology().num_hosts; }
  const std::string& host() const override { return members_[static_cast<size_t>(rank_)].host; }
  std::string describe() const override;
  std::string topology_report() const override;
  Work allreduce(const void* send, void* recv, size_t count, DataType t, RedOp op,
                 CollOptions o) override;
  Work reduce_scatter(const void* send, void* recv, size_t count, DataType t, RedOp op,
                      CollOptions o) override;
  Work allgather(const void* send, void* recv, size_t count, DataType t, CollOptions o) override;
  Work broadcast(const void* send, void* recv, size_t count, DataType t, int root,
                 CollOptions o) override;
  Work reduce(const void* send, void* recv, size_t count, DataType t, RedOp op, int root,
              CollOptions o) override;
  Work alltoall(const void* send, void* recv, size_t count, DataType t, CollOptions o) override;
  Work gather(const void* send, void* recv, size_t count, DataType t, int root,
              CollOptions o) override;
  Work scatter(const void* send, void* recv, size_t count, DataType t, int root,
               CollOptions o) override;
  Work send(const void* data, size_t count, DataType t, int peer) override;
  Work recv(void* data, size_t count, DataType t, int peer) override;
  Work barrier() override;
  std::shared_ptr<Communicator> split(int color, int key) override;
  SharedBuffer alloc_shared(size_t bytes) override;
  std::shared_ptr<Mailbox> open_mailbox() override;
  void abort(const std::string& reason) override;

  void keep_alive(std::unique_ptr<StoreServer> server);
  // COHORT_PROBE=1: measures link latency and bandwidth (a bounded probe) for the cost model.
  // Collective over the communicator.
  void probe_links();
  // Runs queued calls on the calling thread until `ready` or the queue is empty; false when
  // another thread is running them.
  bool help(const std::atomic<int>& ready);

 private:
  // The one way into the queue for a collective: arguments checked, algorithm chosen, call
  // numbered and queued.
  Work issue(Coll kind, const void* send, void* recv, size_t count, DataType t, RedOp op, int root,
             Algo forced);
  Work point_to_point(bool is_send, const void* send, void* recv, size_t count, DataType t,
                      int peer);
  // choose_algorithm, remembered per (collective, size, forced) for this communicator.
  AlgoChoice choose(Coll kind, size_t bytes, Algo forced);
  void validate_args(const char* what, size_t count, int root, int peer);
  Work submit(Call call);
  bool run_next();  // caller holds run_mu_
  void progress_loop();
  std::string fail_broken(const std::string& message);  // returns the job's first failure
  void linger_for_peers();

  Store store_;
  std::string token_;
  std::string name_;
  uint64_t comm_id_ = 0;
  int rank_ = 0;
  std::vector<PeerDesc> members_;
  Settings settings_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FlightRecorder> flight_;
  std::unique_ptr<Heartbeat> heartbeat_;  // null for one rank or COHORT_HEARTBEAT=0

  uint32_t next_seq_ = 0;           // collectives issued (caller thread)
  std::vector<uint32_t> send_seq_;  // point-to-point counters per peer (caller thread)
  std::vector<uint32_t> recv_seq_;
  uint32_t split_seq_ = 0;
  uint32_t mailbox_seq_ = 0;                          // open_mailbox calls (caller thread)
  uint64_t shared_seq_ = 0;                           // alloc_shared calls (caller thread)
  std::unordered_map<uint64_t, AlgoChoice> choices_;  // caller thread
  bool probed_ = false;                               // the engine's link figures were measured

  // A queued call and the Work it completes.
  struct Queued {
    Call call;
    std::shared_ptr<WorkState> work;
    uint64_t flight_id = 0;
  };
  std::mutex mu_;
  std::mutex run_mu_;  // held while a call runs: calls run one at a time, in order
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  // The progress thread polls the queue every poll_us_, from kMinPollUs when busy to kMaxPollUs
  // when idle; calls wake it only when it sleeps longer than kWakeAboveUs. While waiting
  // callers run the calls themselves (callers_ran_), it polls at least every kCallerPollUs and
  // calls do not wake it, until none came for kCallerQuietUs.
  static constexpr int kMinPollUs = 100, kMaxPollUs = 20000, kWakeAboveUs = 400;
  static constexpr int kCallerPollUs = 1000, kCallerQuietUs = 50000;
  std::atomic<int> poll_us_{kMaxPollUs};
  std::atomic<bool> callers_ran_{false};
  uint64_t submitted_ = 0;   // calls submitted; guarded by mu_
  bool callers_run_ = true;  // Work::wait() may run queued calls (set once at construction)
  bool stopping_ = false;
  std::string broken_;  // the thread running calls only
  std::thread thread_;
  std::unique_ptr<StoreServer> server_;
};

// 24 hex digits from std::random_device: a job token (job_env.cc).
std::string random_token();

}  // namespace detail
}  // namespace cohort::comm
