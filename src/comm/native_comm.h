// Cohort's own backend: the communicator that owns links to every peer (shared memory inside a
// host, TCP across hosts), a progress thread that runs collectives in issue order, and the
// Engine the algorithms use.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cohort/comm/communicator.h"
#include "cohort/comm/store.h"
#include "cohort/comm/transport.h"
#include "cohort/comm/wire.h"
#include "engine.h"
#include "transport/peer.h"

namespace cohort::comm {

class StoreServer;

namespace detail {

struct Settings {
  std::chrono::milliseconds timeout{300000};
  bool force_tcp = false;   // COHORT_TRANSPORT=tcp: TCP to every peer
  bool ucx = false;         // COHORT_TRANSPORT=ucx: UCX to every peer
  bool ucx_remote = false;  // auto, with UCX and an RDMA device: UCX to other hosts
  bool net_everywhere() const { return force_tcp || ucx; }
  int tcp_streams = 1;
  size_t stripe_min = 1u << 20;  // messages this large are striped across TCP lanes
  size_t shm_ring = 4u << 20;
  Algo algo = Algo::automatic;
  static Settings from_env();
};

class NativeComm final : public Communicator,
                         public Engine,
                         public std::enable_shared_from_this<NativeComm> {
 public:
  // Collective over `members` (global ranks of the parent job, in order); store is private to
  // this communicator. `me` is this process's description.
  NativeComm(Store store, std::string token, std::string comm_name, int rank,
             std::vector<PeerDesc> members, Settings s);
  ~NativeComm() override;

  static std::shared_ptr<NativeComm> init_world(const JobEnv& env, Settings s);

  // Communicator
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int num_hosts() const override { return topo_.num_hosts; }
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
  void abort(const std::string& reason) override;

  // Engine
  const CollDesc& desc() const override { return desc_; }
  void exchange_n(const SendOp* sends, size_t ns, const RecvOp* recvs, size_t nr) override;
  const Topology& topology() const override { return topo_; }
  void* scratch(size_t bytes, int slot) override;

  void keep_alive(std::unique_ptr<StoreServer> server);
  // COHORT_PROBE=1: measures link latency and bandwidth (a bounded probe) for the cost model.
  // Collective over the communicator.
  void probe_links();
  // Runs queued tasks on the calling thread until `ready` or the queue is empty; false when
  // another thread is running them.
  bool help(const std::atomic<int>& ready);

 private:
  // A queued call: plain arguments rather than a closure, so that issuing one allocates only
  // its WorkState.
  struct Task {
    Task() = default;
    Task(CollDesc d, const void* s, void* r, Algo a = Algo::automatic, int p = -1, bool snd = false)
        : desc(d), send(s), recv(r), algo(a), peer(p), is_send(snd) {}
    CollDesc desc;
    const void* send = nullptr;
    void* recv = nullptr;
    Algo algo = Algo::automatic;
    int peer = -1;
    bool is_send = false;
    std::shared_ptr<WorkState> work;
  };
  Work submit(Task task);
  void run_task(const Task& t);
  void progress_loop();
  bool run_next();                                      // caller holds run_mu_
  std::string fail_broken(const std::string& message);  // returns the job's first failure
  void check_while_idle(Clock::time_point idle_since);
  std::vector<Link*> links_of(int peer) const;  // every lane and the eager link
  [[noreturn]] void mismatch(int peer, const wire::MsgHeader& h);
  void linger_for_peers();
  void connect_links();

  void validate_args(const char* what, size_t count, int root, int peer);

  Store store_;
  std::string token_;
  std::string name_;
  uint64_t comm_id_ = 0;
  int rank_ = 0;
  std::vector<PeerDesc> members_;
  Settings settings_;
  Topology topo_;
  int local_rank_ = 0, local_size_ = 1;
  std::vector<std::vector<std::unique_ptr<Link>>> links_;  // [peer][lane]
  std::vector<std::unique_ptr<Link>> eager_;               // [peer]: small messages (shm only)

  CollDesc desc_;
  uint32_t next_seq_ = 0;           // collectives issued (caller thread)
  std::vector<uint32_t> send_seq_;  // point-to-point counters per peer (caller thread)
  std::vector<uint32_t> recv_seq_;
  uint32_t split_seq_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
  const char* ran_algo_ = "";  // what the current task ran (a static name)
  struct Transfer;
  std::vector<Transfer> xfers_;  // reused by exchange() so that small calls do not allocate

  std::mutex mu_;
  std::mutex run_mu_;  // held while a task runs: tasks run one at a time, in order
  std::condition_variable cv_;
  std::deque<Task> queue_;
  // The progress thread polls the queue every poll_us_, from kMinPollUs when busy to kMaxPollUs
  // when idle; calls wake it only when it sleeps longer than kWakeAboveUs. While waiting
  // callers run the calls themselves (callers_ran_), it polls at least every kCallerPollUs and
  // calls do not wake it, until none came for kCallerQuietUs.
  static constexpr int kMinPollUs = 100, kMaxPollUs = 20000, kWakeAboveUs = 400;
  static constexpr int kCallerPollUs = 1000, kCallerQuietUs = 50000;
  std::atomic<int> poll_us_{kMaxPollUs};
  std::atomic<bool> callers_ran_{false};
  uint64_t submitted_ = 0;   // calls submitted; guarded by mu_
  bool callers_run_ = true;  // Work::wait() may run queued tasks (set once at construction)
  bool probed_ = false;      // topo_'s link figures were measured
  bool stopping_ = false;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // guarded by mu_
  std::string broken_;        // progress thread only
  std::thread thread_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace detail
}  // namespace cohort::comm
