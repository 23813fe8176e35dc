// ProcessGroupCohort: torch.distributed's ProcessGroup over a Cohort communicator. Each torch
// collective is checked and issued at once as one Cohort call (a padded alltoall also agrees its
// block size first); a completion thread waits on the calls in issue order, copies results into
// tensors that were not contiguous, and completes the torch Work and its Future, which PyTorch
// DDP's reducer waits on. send, recv and recv from any source go through the communicator's
// Mailbox instead: each completes by itself, in whatever order the ranks posted them (PyTorch's
// pipeline schedules rely on that through batch_isend_irecv).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cohort/comm/communicator.h"

namespace cohort::python {

class CohortWork : public c10d::Work {
 public:
  CohortWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Called once, by the completion thread or the mailbox: null on success, else Cohort's error.
  void complete(std::exception_ptr error);
  // A receive's sender, before complete().
  void set_source(int rank) { source_ = rank; }
  int sourceRank() const override;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
};

class ProcessGroupCohort : public c10d::ProcessGroup {
 public:
  // Joins through `store` (collective over the `size` ranks); `timeout` bounds every call.
  ProcessGroupCohort(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupCohort() override;

  const std::string getBackendName() const override { return "cohort"; }
  std::string describe() const { return comm_->describe(); }

  using Tensors = std::vector<at::Tensor>;
  using Work = c10::intrusive_ptr<c10d::Work>;
  Work broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  Work allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  Work allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  Work reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  Work allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                 const c10d::AllgatherOptions& opts) override;
  Work allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                           const c10d::AllgatherOptions& opts) override;
  Work _allgather_base(at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts) override;
  Work gather(std::vector<Tensors>& outputs, Tensors& inputs,
              const c10d::GatherOptions& opts) override;
  Work scatter(Tensors& outputs, std::vector<Tensors>& inputs,
               const c10d::ScatterOptions& opts) override;
  Work reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                      const c10d::ReduceScatterOptions& opts) override;
  Work _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) override;
  Work alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                     std::vector<int64_t>& input_splits,
                     const c10d::AllToAllOptions& opts) override;
  Work alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  Work send(Tensors& tensors, int dst_rank, int tag) override;
  Work recv(Tensors& tensors, int src_rank, int tag) override;
  Work recvAnysource(Tensors& tensors, int tag) override;
  Work barrier(const c10d::BarrierOptions& opts) override;

  // Waits until the completion thread holds no call: everything issued has completed and its
  // tensors are released. Call without the GIL (releasing a tensor may need it).
  void drain();
  // drain() on every live group. `import cohort` runs it at interpreter exit, before Python
  // finalizes: a thread that needs the GIL after that is ended by Python, and one that ends
  // while destroying a tensor aborts the process.
  static void drain_all();

 private:
  // One torch call in flight: its Cohort calls, the tensors they read and write (kept alive),
  // what to copy out once they finished, and the torch Work to complete.
  struct Pending {
    std::vector<comm::Work> calls;
    Tensors keep;
    std::function<void()> finish;
    c10::intrusive_ptr<CohortWork> work;
    // What the call reads (or writes) for `user`: the tensor itself when contiguous, else a
    // copy, which is kept alive (and copied into `user` at the end). A contiguous tensor costs
    // nothing here: no copy, no allocation.
    void read_from(const at::Tensor& user, const at::Tensor& staged);
    void write_back(const at::Tensor& user, const at::Tensor& staged);
  };
  Work submit(c10d::OpType type, Tensors outputs, Pending p);
  // A receive through the mailbox from `src_rank` (comm::kAnySource: any rank).
  Work mailbox_recv(const char* op, c10d::OpType type, Tensors& tensors, int src_rank, int tag);
  std::shared_ptr<comm::Mailbox> mailbox();  // null once closed
  // Closes the mailbox: calls still posted (receives nobody sent to) fail and are completed.
  void close_mailbox();
  // The point-to-point completion thread: runs, in the order the mailbox answered them, what
  // completes each call's torch Work (the mailbox's own thread must not run a Future's callbacks,
  // which may wait on another of its calls).
  void complete_p2p();
  void queue_p2p(std::function<void()> done);
  // alltoall with a different block per peer: agree on the largest block, pad, exchange.
  Work padded_alltoall(const char* op, c10d::OpType type, Tensors outputs,
                       const std::vector<at::Tensor>& send_blocks,
                       const std::vector<at::Tensor>& recv_blocks);
  void complete_in_order();

  std::shared_ptr<comm::Communicator> comm_;
  std::mutex mu_;
  std::shared_ptr<comm::Mailbox> mailbox_;  // guarded by mu_
  size_t mailbox_sends_ = 0;                // sends not completed yet
  std::deque<std::function<void()>> p2p_done_;
  bool p2p_busy_ = false;  // the point-to-point thread runs a popped completion
  bool p2p_stopping_ = false;
  std::condition_variable p2p_cv_;
  std::thread p2p_completer_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool busy_ = false;  // the completion thread holds a popped call
  std::condition_variable idle_cv_;
  std::chrono::milliseconds timeout_;
  bool stopping_ = false;
  std::thread completer_;
};

}  // namespace cohort::python
