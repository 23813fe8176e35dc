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
#include "cohort/nn/model.h"

namespace cohort::dist {

// What the gradient buckets travel as: f32 (none), or converted to bf16 or f16 for the wire.
enum class Compression { none, bf16, f16 };
const char* compression_name(Compression c);
Compression parse_compression(const std::string& s);  // throws naming the value and the choices

struct DdpOptions {
  double first_bucket_mb = 1.0;
  double bucket_mb = 25.0;
  Compression compression = Compression::none;
};

struct Bucket {
  size_t begin = 0, end = 0;  // element range of the flat gradient buffer
  std::vector<int> params;    // indices, in the order backward finishes them
  int pending = 0;
  comm::Work work;
  nn::Tensor wire;         // bf16/f16 copy on the wire when compressing
  double launched_at = 0;  // seconds since the step's backward began
};

class Ddp {
 public:
  Ddp(nn::Model& m, std::shared_ptr<comm::Communicator> c, DdpOptions o = {});

  // Every rank takes rank 0's parameters and buffers.
  void broadcast_from_rank0();
  // Every rank takes rank 0's buffers (BatchNorm's running statistics, which plain BatchNorm
  // updates from each rank's own batches), before evaluation or a checkpoint.
  void broadcast_buffers();
  // Backward of one micro-batch under DDP: arms the hooks on its tape, then runs it. DDP owns
  // the averaging: the loss gradient is scaled by loss_scale / world here, and the buckets are
  // summed, which leaves the average (an `avg` allreduce cost the collective another pass, 42%
  // more). With sync = false (all but the last micro-batch of an accumulation), gradients only
  // accumulate locally, as PyTorch's no_sync().
  void backward(nn::Tape& tape, const nn::Var& loss, float loss_scale, bool sync);
  // Waits for every bucket (launching any a rank's graph never finished) and leaves the
  // averaged gradients in the flat buffer. Returns the seconds spent waiting.
  double finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Seconds from prepare() to the first bucket's launch and to the end of backward (when
  // finish() was called), for the overlap test and the report.
  double first_launch_s() const { return buckets_.empty() ? 0 : buckets_.front().launched_at; }
  double backward_end_s() const { return backward_end_s_; }
  comm::Communicator& communicator() { return *comm_; }

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
};

// Every rank takes `root`'s parameters (the flat value buffer) and buffers (BatchNorm's running
// statistics): at the start of a run, after a resume, before evaluation.
void broadcast_parameters(nn::Model& m, comm::Communicator& c, int root = 0);
void broadcast_buffers(nn::Model& m, comm::Communicator& c, int root = 0);

// SyncBatchNorm: every BatchNorm2d of the model takes its batch statistics over all ranks, on
// a communicator of its own (split from c) so that its small reductions never queue behind
// DDP's buckets.
void sync_batch_norm(nn::Model& m, const std::shared_ptr<comm::Communicator>& c);

}  // namespace cohort::dist
