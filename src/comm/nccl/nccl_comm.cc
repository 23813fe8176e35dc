// The `nccl` backend (COHORT_BACKEND=nccl): every collective of the Communicator interface runs
// on device buffers through NCCL, queued on a communication stream of its own after the compute
// stream's work so far. A Work completes when the CUDA event recorded after its call has
// passed; no host synchronisation is involved in issuing one.
//
// Rendezvous: Cohort's store. Rank 0 asks NCCL for its unique id and publishes it; every rank
// then takes its local rank's GPU and says in the store whether it could; only when every rank
// could does any of them enter ncclCommInitRank, so one rank without a usable GPU fails every rank
// at once with its reason instead of leaving the others inside NCCL.
//
// NCCL's weak spot is hangs. A watchdog thread polls each pending call's event, the
// communicator's asynchronous error and the calls' age: on an error or a call older than the
// timeout it aborts the communicator (ncclCommAbort) and fails every pending call, naming this
// rank, the call and NCCL's own message.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "call.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/store.h"
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "flight_recorder.h"
#include "native_comm.h"
#include "settings.h"

namespace cohort::comm {

namespace {

using Clock = std::chrono::steady_clock;

const char* nccl_message(ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return last && *last ? last : ncclGetErrorString(r);
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
    case DataType::f16:
      return ncclFloat16;
    case DataType::bf16:
      return ncclBfloat16;
    case DataType::i32:
      return ncclInt32;
    case DataType::i64:
      return ncclInt64;
    case DataType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::sum:
      return ncclSum;
    case RedOp::prod:
      return ncclProd;
    case RedOp::min:
      return ncclMin;
    case RedOp::max:
      return ncclMax;
    case RedOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

// A unique id travels through the store as text (the store's values are strings).
std::string to_hex(const ncclUniqueId& id) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += d[(static_cast<unsigned char>(c) >> 4) & 15];
    s += d[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s) {
  ncclUniqueId id{};
  COHORT_CHECK(s.size() == 2 * sizeof(id.internal), "the store's NCCL unique id has "
                                                        << s.size() << " characters, expected "
                                                        << 2 * sizeof(id.internal));
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(nib(s[2 * i]) * 16 + nib(s[2 * i + 1]));
  return id;
}

// The communicator's communicators are non-blocking (so that init cannot hang past the
// timeout): a call that returns ncclInProgress is done once ncclCommGetAsyncError says so.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &r);
  }
  return r;
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int local_rank, int local_size, std::string host,
           std::chrono::milliseconds timeout, std::optional<std::string> flight_dir)
      : flight_(std::make_unique<detail::FlightRecorder>("nccl", rank, size, iota(size), host,
                                                         flight_dir)),
        flight_dir_(std::move(flight_dir)),
        comm_(comm),
        rank_(rank),
        size_(size),
        local_rank_(local_rank),
        local_size_(local_size),
        host_(std::move(host)),
        timeout_(timeout) {
    stream_ = static_cast<cudaStream_t>(cuda::Stream::create().handle());
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (!aborted_) {
      // Non-blocking: finalising completes in the background; destroy once it has.
      if (settle(comm_, ncclCommFinalize(comm_), timeout_) == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int num_hosts() const override { return (size_ + local_size_ - 1) / local_size_; }
  const std::string& host() const override { return host_; }
  std::string describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    std::ostringstream o;
    o << "nccl " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100
      << " on cuda:" << cuda::current_device() << ", " << size_ << " ranks";
    return o.str();
  }
  std::string topology_report() const override {
    return describe() +
           "\nNCCL chooses its transports (NVLink, PCIe, InfiniBand, GPUDirect RDMA) itself: "
           "NCCL_DEBUG=INFO prints its choice per channel.\n";
  }

  Work allreduce(const void* send, void* recv, size_t count, DataType t, RedOp op,
                 CollOptions) override {
    return issue(call_of(detail::Coll::allreduce, count, t, op), "allreduce", count, [&] {
      return ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  Work reduce_scatter(const void* send, void* recv, size_t count, DataType t, RedOp op,
                      CollOptions) override {
    return issue(call_of(detail::Coll::reduce_scatter, count, t, op), "reduce_scatter", count, [&] {
      return ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  Work allgather(const void* send, void* recv, size_t count, DataType t, CollOptions) override {
    return issue(call_of(detail::Coll::allgather, count, t), "allgather", count,
                 [&] { return ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_); });
  }
  Work broadcast(const void* send, void* recv, size_t count, DataType t, int root,
                 CollOptions) override {
    check_root(root, "broadcast");
    return issue(
        call_of(detail::Coll::broadcast, count, t, RedOp::sum, root), "broadcast", count,
        [&] { return ncclBroadcast(send, recv, count, nccl_type(t), root, comm_, stream_); });
  }
  Work reduce(const void* send, void* recv, size_t count, DataType t, RedOp op, int root,
              CollOptions) override {
    check_root(root, "reduce");
    return issue(call_of(detail::Coll::reduce, count, t, op, root), "reduce", count, [&] {
      return ncclReduce(send, recv, count, nccl_type(t), nccl_op(op), root, comm_, stream_);
    });
  }
  // alltoall, gather and scatter are grouped sends and receives, as NCCL's documentation has it.
  Work alltoall(const void* send, void* recv, size_t count, DataType t, CollOptions) override {
    const size_t bytes = count * dtype_size(t);
    return issue(call_of(detail::Coll::alltoall, count, t), "alltoall", count, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        r = ncclSend(static_cast<const char*>(send) + p * bytes, count, nccl_type(t), p, comm_,
                     stream_);
        if (r == ncclSuccess)
          r = ncclRecv(static_cast<char*>(recv) + p * bytes, count, nccl_type(t), p, comm_,
                       stream_);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  Work gather(const void* send, void* recv, size_t count, DataType t, int root,
              CollOptions) override {
    check_root(root, "gather");
    const size_t bytes = count * dtype_size(t);
    return issue(call_of(detail::Coll::gather, count, t, RedOp::sum, root), "gather", count, [&] {
      ncclResult_t r = ncclGroupStart();
      if (rank_ == root) {
        for (int p = 0; p < size_ && r == ncclSuccess; ++p)
          r = ncclRecv(static_cast<char*>(recv) + p * bytes, count, nccl_type(t), p, comm_,
                       stream_);
      }
      if (r == ncclSuccess) r = ncclSend(send, count, nccl_type(t), root, comm_, stream_);
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  Work scatter(const void* send, void* recv, size_t count, DataType t, int root,
               CollOptions) override {
    check_root(root, "scatter");
    const size_t bytes = count * dtype_size(t);
    return issue(call_of(detail::Coll::scatter, count, t, RedOp::sum, root), "scatter", count, [&] {
      ncclResult_t r = ncclGroupStart();
      if (rank_ == root) {
        for (int p = 0; p < size_ && r == ncclSuccess; ++p)
          r = ncclSend(static_cast<const char*>(send) + p * bytes, count, nccl_type(t), p, comm_,
                       stream_);
      }
      if (r == ncclSuccess) r = ncclRecv(recv, count, nccl_type(t), root, comm_, stream_);
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  Work send(const void* data, size_t count, DataType t, int peer) override {
    check_root(peer, "send");
    return issue(call_of(detail::Coll::sendrecv, count, t, RedOp::sum, 0, peer, true), "send",
                 count, [&] { return ncclSend(data, count, nccl_type(t), peer, comm_, stream_); });
  }
  Work recv(void* data, size_t count, DataType t, int peer) override {
    check_root(peer, "recv");
    return issue(call_of(detail::Coll::sendrecv, count, t, RedOp::sum, 0, peer, false), "recv",
                 count, [&] { return ncclRecv(data, count, nccl_type(t), peer, comm_, stream_); });
  }
  Work barrier() override {
    // An allreduce of one integer in device memory this communicator keeps.
    if (!barrier_buf_) {
      if (cudaMalloc(&barrier_buf_, sizeof(int)) != cudaSuccess) {
        COHORT_THROW_AS(CommError, "nccl barrier: no device memory for its one integer");
      }
      cudaMemsetAsync(barrier_buf_, 0, sizeof(int), stream_);
    }
    return issue(call_of(detail::Coll::barrier, 1, DataType::i32), "barrier", 1, [&] {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    ncclResult_t r =
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr);
    if (r == ncclInProgress && sub) r = settle(sub, r, timeout_);
    if (r != ncclSuccess) {
      COHORT_THROW_AS(CommError, "rank " << rank_ << ": ncclCommSplit failed: " << nccl_message(r));
    }
    if (color < 0 || !sub) return nullptr;
    int n = 0, me = 0;
    ncclCommCount(sub, &n);
    ncclCommUserRank(sub, &me);
    return std::make_shared<NcclComm>(sub, me, n, std::min(local_rank_, n - 1),
                                      std::min(local_size_, n), host_, timeout_, flight_dir_);
  }
  void abort(const std::string& reason) override {
    fail_all(std::make_exception_ptr(
        CommError(__FILE__, __LINE__,
                  "rank " + std::to_string(rank_) + ": the communicator was aborted: " + reason)));
  }

 private:
  struct Pending {
    std::shared_ptr<WorkState> work;
    cudaEvent_t done;
    Clock::time_point issued;
    std::string what;
    uint64_t flight_id;
  };

  void check_root(int r, const char* what) const {
    if (r < 0 || r >= size_) {
      COHORT_THROW(what << ": rank " << r << " is not one of 0.." << size_ - 1);
    }
  }

  static detail::Call call_of(detail::Coll coll, size_t count, DataType t, RedOp op = RedOp::sum,
                              int root = 0, int peer = -1, bool is_send = false) {
    detail::Call c;
    c.desc.coll = coll;
    c.desc.dtype = t;
    c.desc.op = op;
    c.desc.root = static_cast<uint32_t>(root);
    c.desc.count = count;
    c.algo = Algo::direct;
    c.reason = "COHORT_BACKEND=nccl";
    c.peer = peer;
    c.is_send = is_send;
    return c;
  }

  // Issues `call` (an NCCL call on the communication stream) as the Work of `c`, which the
  // flight recorder keeps.
  template <class F>
  Work issue(detail::Call c, const char* name, size_t count, F&& call) {
    auto w = std::make_shared<WorkState>();
    w->algo = "nccl";
    w->reason = "COHORT_BACKEND=nccl";
    std::ostringstream what;
    what << name << " of " << count << " elements";
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      COHORT_THROW_AS(CommError, "rank " << rank_ << ": " << what.str()
                                         << " on an aborted NCCL communicator: " << abort_why_);
    }
    // After the compute stream's work so far (the gradients it wrote).
    cudaEvent_t ready = event();
    cudaEventRecord(ready, static_cast<cudaStream_t>(cuda::Stream::compute().handle()));
    cudaStreamWaitEvent(stream_, ready, 0);
    spare_.push_back(ready);
    // A non-blocking communicator may still be enqueueing the call when it returns: the event
    // that completes its Work is recorded only once it is on the stream.
    const ncclResult_t r = settle(comm_, call(), timeout_);
    if (r != ncclSuccess) {
      COHORT_THROW_AS(CommError, "rank " << rank_ << ": NCCL " << what.str()
                                         << " failed at issue: " << nccl_message(r));
    }
    c.desc.seq = seq_++;
    const uint64_t id = flight_->queued(c);
    flight_->started(id);  // enqueued on the stream: NCCL runs it from there
    cudaEvent_t done = event();
    cudaEventRecord(done, stream_);
    pending_.push_back(Pending{w, done, Clock::now(), what.str(), id});
    cv_.notify_all();
    return Work(w);
  }

  cudaEvent_t event() {  // under mu_
    cudaEvent_t e = nullptr;
    if (!spare_.empty()) {
      e = spare_.front();
      spare_.pop_front();
    } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      COHORT_THROW_AS(CommError, "rank " << rank_ << ": cudaEventCreate failed");
    }
    return e;
  }

  static void finish(WorkState& w, std::exception_ptr error) {
    w.error = std::move(error);
    w.ready.store(1, std::memory_order_release);
    w.ready.notify_all();
  }

  void fail_all(std::exception_ptr e) {
    std::deque<Pending> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_) {
        aborted_ = true;
        ncclCommAbort(comm_);
      }
      failed.swap(pending_);
    }
    for (Pending& p : failed) flight_->ended(p.flight_id, false);
    // The calls that never completed, for `cohort doctor` (COHORT_FLIGHT_DIR).
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      flight_->dump(x.what());
    }
    for (Pending& p : failed) finish(*p.work, e);
  }

  // The watchdog: completes calls whose event passed, in order; fails everything on NCCL's
  // asynchronous error or a call older than the timeout.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (pending_.empty()) {
        cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
        continue;
      }
      while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
        Pending p = std::move(pending_.front());
        pending_.pop_front();
        spare_.push_back(p.done);
        flight_->ended(p.flight_id, true);
        finish(*p.work, nullptr);
      }
      if (pending_.empty()) continue;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const Pending& oldest = pending_.front();
      const auto age = Clock::now() - oldest.issued;
      if ((async != ncclSuccess && async != ncclInProgress) || age > timeout_) {
        std::string why;
        if (async != ncclSuccess && async != ncclInProgress) {
          why = "rank " + std::to_string(rank_) + ": NCCL reported an error during " + oldest.what +
                ": " + nccl_message(async);
        } else {
          why = "Timed out: rank " + std::to_string(rank_) + "'s NCCL " + oldest.what +
                " has not completed after " +
                std::to_string(std::chrono::duration_cast<std::chrono::seconds>(age).count()) +
                " s (COHORT_TIMEOUT): a peer is dead or stuck; the communicator was aborted";
        }
        abort_why_ = why;
        lock.unlock();
        fail_all(async != ncclSuccess && async != ncclInProgress
                     ? std::make_exception_ptr(CommError(__FILE__, __LINE__, why))
                     : std::make_exception_ptr(TimeoutError(__FILE__, __LINE__, why)));
        COHORT_LOG(error, why);
        lock.lock();
        continue;
      }
      cv_.wait_for(lock, std::chrono::microseconds(200));
    }
  }

 public:
  // Rank 0 serves the rendezvous store for as long as the communicator lives.
  void keep_alive(std::unique_ptr<StoreServer> server) { server_ = std::move(server); }

 private:
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<detail::FlightRecorder> flight_;
  std::optional<std::string> flight_dir_;
  uint32_t seq_ = 0;
  ncclComm_t comm_;
  int rank_, size_, local_rank_, local_size_;
  std::string host_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::deque<cudaEvent_t> spare_;
  bool stopping_ = false, aborted_ = false;
  std::string abort_why_;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const JobEnv& env, const detail::Settings& s) {
  // The store, as the native engine's world reaches it.
  std::unique_ptr<StoreServer> server;
  std::string addr = env.master_addr;
  uint16_t port = env.master_port;
  if (env.world == 1) {
    server = std::make_unique<StoreServer>("127.0.0.1", 0, env.token);
    addr = "127.0.0.1";
    port = server->port();
  } else if (env.rank == 0 && !env.store_external) {
    server = std::make_unique<StoreServer>(
        addr == "127.0.0.1" || addr == "localhost" ? addr : "0.0.0.0", port, env.token);
  }
  Store store = Store(Endpoint{addr, port}, env.token, s.timeout).prefixed("nccl/");
  const std::string me = std::to_string(env.rank);

  // The unique id, from rank 0 through the store.
  if (env.rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      store.set("status/0", std::string("ncclGetUniqueId failed: ") + nccl_message(r));
      COHORT_THROW_AS(CommError,
                      "COHORT_BACKEND=nccl: rank 0: ncclGetUniqueId failed: " << nccl_message(r));
    }
    store.set("unique_id", to_hex(id));
  }
  const std::string hex = store.get("unique_id");
  const ncclUniqueId id = from_hex(hex);
  COHORT_LOG(debug, "nccl: rank " << env.rank << " has unique id " << hex.substr(0, 16) << "...");

  // Each rank's GPU, then every rank's verdict before any enters NCCL.
  std::string status = "ok";
  try {
    if (!cuda::device_chosen())
      cuda::use_device(env.local_rank,
                       "its GPU (local rank " + std::to_string(env.local_rank) + ")");
  } catch (const Error& e) {
    status = e.message();
  }
  store.set("status/" + me, status);
  // Every rank's verdict first, then the first failure: each rank reports, and none leaves the
  // round (or is stopped by its launcher) before all have.
  std::vector<std::string> verdicts(env.world);
  for (int r = 0; r < env.world; ++r) verdicts[r] = store.get("status/" + std::to_string(r));
  for (int r = 0; r < env.world; ++r) {
    const std::string& other = verdicts[r];
    if (other != "ok") {
      COHORT_THROW_AS(CommError, "COHORT_BACKEND=nccl: rank "
                                     << r << " cannot join"
                                     << (r == env.rank ? "" : " (seen from rank " + me + ")")
                                     << ": " << other);
    }
  }

  // ncclCommInitRank, non-blocking, so that a peer that dies inside it cannot hold this rank
  // past the timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, env.world, id, env.rank, &config);
  const auto deadline = Clock::now() + s.timeout;
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      COHORT_THROW_AS(TimeoutError, "Timed out: rank "
                                        << env.rank
                                        << ": ncclCommInitRank did not finish within "
                                           "COHORT_TIMEOUT (a peer dead or stuck)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    COHORT_THROW_AS(CommError, "COHORT_BACKEND=nccl: rank "
                                   << env.rank << ": ncclCommInitRank failed: " << nccl_message(r));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  auto c = std::make_shared<NcclComm>(comm, env.rank, env.world, env.local_rank, env.local_world,
                                      host, s.timeout, s.flight_dir);
  c->keep_alive(std::move(server));
  return c;
}

}  // namespace cohort::comm
