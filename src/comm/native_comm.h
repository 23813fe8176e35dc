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
  bool force_tcp = false;
  int tcp_streams = 1;
  size_t stripe_min = 1u << 20;  // messages this large are striped across TCP lanes
  size_t shm_ring = 4u << 20;
  Algo algo = Algo::automatic;
  static Settings from_env();
};

class NativeComm final : public Communicator, public Engine {
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
  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) override;
  const Topology& topology() const override { return topo_; }
  void* scratch(size_t bytes, int slot) override;

  void keep_alive(std::unique_ptr<StoreServer> server);

 private:
  struct Task {
    CollDesc desc;
    std::function<void()> fn;
    std::shared_ptr<WorkState> work;
  };
  Work submit(CollDesc d, std::function<void()> fn);
  void progress_loop();
  void fail_broken(const std::string& message);
  void check_while_idle(Clock::time_point idle_since);
  [[noreturn]] void mismatch(int peer, const wire::MsgHeader& h);
  std::string root_cause();
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

  CollDesc desc_;
  uint32_t next_seq_ = 0;           // collectives issued (caller thread)
  std::vector<uint32_t> send_seq_;  // point-to-point counters per peer (caller thread)
  std::vector<uint32_t> recv_seq_;
  uint32_t split_seq_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
  std::string ran_algo_;  // progress thread: what the current task ran

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // guarded by mu_
  std::string broken_;        // progress thread only
  std::thread thread_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace detail
}  // namespace cohort::comm
