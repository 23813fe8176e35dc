// Data-parallel training (PyTorch DDP's design on Cohort's collectives). Parameters are grouped
// into buckets in reverse registration order (the order backward finishes them): the first
// bucket small so that communication starts early, the middle ones larger so that each
// allreduce is bandwidth-bound, and the last (the first-registered parameters, final only when
// backward ends) small again, since nothing is left to overlap its transfer with. A bucket is a
// contiguous range of the model's flat gradient buffer, so the gradients are already in place:
// nothing is copied in or out. When the tape reports a bucket's last gradient final, its allreduce
// (a sum over ranks) starts asynchronously while backward goes on; finish() waits for the rest,
// which is the exposed communication.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/dist/data_parallel.h"
#include "cohort/nn/model.h"

namespace cohort::dist {

struct Bucket {
  size_t begin = 0, end = 0;  // element range of the flat gradient buffer
  std::vector<int> params;    // indices, in the order backward finishes them
  int pending = 0;
  comm::Work work;
  nn::Tensor wire;         // bf16/f16 copy on the wire when compressing
  double launched_at = 0;  // seconds since the step's backward began
};

class Ddp : public DataParallel {
 public:
  // Collective. On one host it moves the model's gradients into memory the ranks read from
  // each other (Communicator::alloc_shared), as the sharded modes re-lay them: an optimizer
  // takes optim_target() after this, as FSDP's must be made after wrapping.
  Ddp(nn::Model& m, std::shared_ptr<comm::Communicator> c, DdpOptions o = {});

  Shard mode() const override { return Shard::none; }
  std::string describe() const override;
  void zero_grad() override;
  const nn::OptimTarget& optim_target() const override { return target_; }
  void after_step() override {}
  void gather_parameters() override {}
  bool replicated() const override { return true; }
  MemoryReport held() const override;
  Traffic traffic() const override;

  // Every rank takes rank 0's parameters and buffers.
  void broadcast_from_rank0();
  // Every rank takes rank 0's buffers (BatchNorm's running statistics, which plain BatchNorm
  // updates from each rank's own batches), before evaluation or a checkpoint.
  void broadcast_buffers() override;
  // Backward of one micro-batch under DDP: arms the hooks on its tape, then runs it. DDP owns
  // the averaging: the loss gradient is scaled by loss_scale / world here, and the buckets are
  // summed, which leaves the average (an `avg` allreduce cost the collective another pass, 42%
  // more). With sync = false (all but the last micro-batch of an accumulation), gradients only
  // accumulate locally, as PyTorch's no_sync().
  void backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync) override;
  // Waits for every bucket (launching any a rank's graph never finished) and leaves the
  // averaged gradients in the flat buffer. Returns the seconds spent waiting.
  double finish() override;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Seconds from prepare() to the first bucket's launch and to the end of backward (when
  // finish() was called), for the overlap test and the report.
  double first_launch_s() const { return buckets_.empty() ? 0 : buckets_.front().launched_at; }
  double backward_end_s() const { return backward_end_s_; }
  comm::Communicator& communicator() override { return *comm_; }

 private:
  void prepare(nn::Tape& tape, bool sync);
  void on_ready(nn::Param& p);
  void launch(Bucket& b);
  double since_prepare() const;

  nn::Model& m_;
  std::shared_ptr<comm::Communicator> comm_;
  DdpOptions o_;
  comm::DataType wire_ = comm::DataType::f32;  // what the buckets travel as (compression)
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // param index -> bucket
  size_t next_launch_ = 0;
  bool sync_ = true;
  int64_t prepared_at_us_ = 0;
  double backward_end_s_ = 0;
  nn::OptimTarget target_;
  bool synced_ = false;       // the last step's gradients were reduced
  comm::SharedBuffer grads_;  // the model's flat gradients, where the host's ranks read them
};

}  // namespace cohort::dist
