// Pipeline parallelism: the model's chain of pieces (nn::Model::pieces) cut at block boundaries
// into S stages on S ranks, each mini-batch split into M micro-batches that stream through them
// under a schedule (GPipe: every forward, then every backward; 1F1B: after a warm-up, one
// forward and one backward in turn, so that a stage holds at most S - stage micro-batches of
// activations instead of M). With S x D ranks, D replicas of the pipeline each take their own
// data, and every stage's replicas allreduce that stage's gradients while the pipeline drains,
// or shard them (ZeRO-1/2/3 over the replicas, PipelineOptions::shard).
//
// Sharding inside a stage works at the grain of the step, not of the micro-batch, as PyTorch's
// pipeline schedules drive FSDP: a stage's gradients add up over its M micro-batches in one
// full-size buffer and are reduce-scattered once, after the last backward; zero3's parameters
// are gathered once, before the first forward, and kept until that last backward. Doing either
// per micro-batch would multiply the replicas' traffic by M (by 2M for zero3's gathers), and
// under 1F1B a stage's first backward comes before its last forward, so the full gradients are
// live for most of the schedule anyway. What zero2 and zero3 save is then the memory between
// steps (the optimiser step and everything outside the schedule): the full-size gradients
// (zero2) and parameters (zero3) go back to the kernel, and each replica keeps 1/D of them.
//
// Ranks: rank = replica * S + stage, so that one replica's stages are neighbours (on one host
// when they fit: activations cross shared memory; gradients cross hosts once per step).
// Activations go forward and their gradients back on four communicators of two ranks each (one
// per direction and neighbour), so that a large send waiting for its receiver never holds up
// traffic the other way; sends are asynchronous, and each receive is posted one ahead, into
// buffers allocated at start-up, so that transfers overlap compute.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/dist/data_parallel.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"

namespace cohort::dist {

enum class Schedule { gpipe, one_f_one_b };
const char* schedule_name(Schedule s);          // "gpipe", "1f1b"
Schedule parse_schedule(const std::string& s);  // throws naming the value and the choices

// One step of a stage's schedule: the forward or the backward of micro-batch `micro`.
struct Action {
  bool forward = true;
  int micro = 0;
};
// Stage `stage`'s actions for one mini-batch, in order.
std::vector<Action> schedule_actions(Schedule s, int stages, int stage, int micro_batches);
// The most micro-batches whose activations the stage holds at once under its actions.
int peak_in_flight(const std::vector<Action>& actions);
// The bubble of a synchronous pipeline with equal stages: (S - 1) / (M + S - 1).
double bubble_formula(int stages, int micro_batches);

// The first piece of each stage after the first (S - 1 cuts) that minimises the costliest
// stage's cost, every stage taking at least one piece. Throws when there are fewer pieces than
// stages.
std::vector<int> balance_cuts(const std::vector<double>& costs, int stages);

struct PipelineOptions {
  int stages = 0;  // 0: no pipeline
  int micro_batches = 1;
  Schedule schedule = Schedule::one_f_one_b;
  std::vector<int> cuts;             // by hand: the first piece of stages 1..S-1; empty: balanced
  std::string balance = "flops";     // flops (counted in one forward) | time (measured on rank 0)
  bool deferred_batch_norm = false;  // running statistics over the whole mini-batch
  bool recompute = false;  // keep each micro-batch's stage input only; forward again in backward
  // Over a stage's replicas, instead of DDP's allreduce (Shard::none):
  // - zero1: each replica updates and keeps the optimiser state of 1/D of the stage; the
  //   gradients are reduce-scattered, the updated values all-gathered after the step;
  // - zero2: the same, and the full-size gradients are given back after the reduce-scatter;
  // - zero3: the same as zero2, and the parameters live as 1/D chunks between steps, gathered
  //   before the step's first forward and given back after its last backward;
  // - hybrid: zero3 over the stage's replicas on one host (every host must hold as many), each
  //   reduced chunk then all-reduced with the ranks that hold it on the other hosts.
  Shard shard = Shard::none;
  // SyncBatchNorm: batch statistics over the replicas' micro-batches.
  bool sync_batch_norm = false;
};

// What one stage measured, summed over the steps since reset_stats().
struct StageStats {
  int steps = 0;
  double step_s = 0;     // wall time of the schedule (first action to last)
  double compute_s = 0;  // forward, backward and the loss
  double idle_s = 0;     // waiting for an activation or a gradient
  double send_s = 0;     // waiting for this stage's sends to be taken
  double reduce_s = 0;   // waiting for the replicas' gradient allreduce (exposed)
  double gather_s = 0;   // zero3: waiting for the stage's parameters before the first forward
  // Bytes held beyond the step's start between actions, peak: the micro-batches' activations
  // in flight (what 1F1B bounds).
  size_t peak_activations = 0;
  size_t peak_step = 0;    // the allocator's peak beyond the step's start (with each op's scratch)
  int peak_in_flight = 0;  // micro-batches held at once, peak
  double bubble() const { return step_s > 0 ? idle_s / step_s : 0; }
};

class Pipeline {
 public:
  // Collective over every rank of world (S x D of them). micro_input is one micro-batch's input
  // shape [N/M, C, H, W]; the shapes between stages are found from it and checked between
  // neighbours before anything trains.
  Pipeline(nn::Model& m, std::shared_ptr<comm::Communicator> world, const PipelineOptions& o,
           const tensor::Shape& micro_input);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int stage() const { return stage_; }
  int stages() const { return o_.stages; }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == o_.stages - 1; }
  const std::vector<int>& cuts() const { return cuts_; }
  // The cut, one line per stage: its pieces, parameters and cost share.
  std::string describe() const;

  // The loss of micro-batch `micro` from its logits (the last stage calls it).
  using LossFn = std::function<nn::Var(const nn::Var& logits, int micro)>;

  // A step reads as DataParallel's: zero_grad, run (once, or once per accumulated mini-batch),
  // finish, the optimiser on optim_target().
  void zero_grad();
  // One mini-batch through the schedule: the first stage slices x, [M * N/M, C, H, W], into
  // micro-batches (other stages ignore x); each loss's gradient is seeded with
  // loss_scale / (M x D), so that the gradients add up to the average over the micro-batches and
  // the replicas (loss_scale 1/A under A accumulated mini-batches). Returns the mean loss over
  // the micro-batches, on every stage.
  float run(const tensor::Tensor& x, const LossFn& loss, float loss_scale = 1.0f);
  // The replicas' allreduce (or, sharded, reduce-scatter) of this stage's gradients, and the
  // deferred BatchNorm statistics committed; returns the seconds spent waiting for it. zero2
  // and zero3 then give the full-size gradients back to the kernel, zero3 the parameters too.
  double finish();
  // After the optimiser step (or a checkpoint load): zero1/2, the replicas' updated chunks to
  // every replica; zero3, the gathered parameters are stale (the next run gathers them).
  void after_step();

  // What the optimiser updates on this rank: this stage's parameters (clipping sums the squared
  // norms over the stages).
  const nn::OptimTarget& optim_target() const { return target_; }
  // This stage's elements of the model's flat buffers.
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }

  // Every stage's parameters and BatchNorm buffers into the model on every rank of world (to
  // save weights, to evaluate, to compare).
  void gather_model();
  // Every stage's BatchNorm buffers into the model on every rank of world (before rank 0
  // writes them into a checkpoint).
  void gather_buffers();

  // This stage's memory: its parameters, gradients and optimiser state, the peak of activations
  // a step held, the receive buffers.
  MemoryReport memory(const nn::Optimizer& opt) const;
  const StageStats& stats() const { return stats_; }
  void reset_stats() { stats_ = StageStats(); }
  // Every rank's stats, by rank of world (collective).
  std::vector<StageStats> gather_stats();
  comm::Communicator& world() { return *world_; }

 private:
  struct Channel;
  struct Micro;
  void run_forward(int micro, const tensor::Tensor& x, const LossFn& loss);
  void run_backward(int micro, const LossFn& loss, float seed);
  void check_shapes();
  // zero3: every unit's chunks from the replicas into the stage's range of the flat values;
  // waiting for the units that begin before flat offset `through` (all by default).
  void start_gather();
  void wait_gather(size_t through = static_cast<size_t>(-1));
  bool sharded() const { return !units_.empty(); }
  bool shards_parameters() const { return o_.shard == Shard::zero3 || o_.shard == Shard::hybrid; }

  nn::Model& m_;
  std::shared_ptr<comm::Communicator> world_, pipe_, replicas_comm_;
  // Sharded: the replicas a unit is split over (all of the stage's, or hybrid's on this host),
  // hybrid's ranks holding the same chunk on the other hosts (null on one host), and the ranks
  // over which clipping sums (every piece of the model once).
  std::shared_ptr<comm::Communicator> shard_comm_, across_, sums_;
  PipelineOptions o_;
  int stage_ = 0, replica_ = 0, replicas_ = 1;
  std::vector<int> cuts_;
  std::vector<double> costs_;  // per piece
  int first_piece_ = 0, last_piece_ = 0;
  size_t begin_ = 0, end_ = 0;
  // Sharded over the replicas: the stage's units (aligned, so that each is D chunks exactly),
  // this replica owning chunk `replica_` of each; the chunks' reduced gradients side by side in
  // shard_grad_ (a unit's at `at`).
  struct ShardUnit {
    size_t begin = 0, len = 0, chunk = 0, at = 0;
  };
  std::vector<ShardUnit> units_;
  size_t shard_elems_ = 0, own_ = 0;
  tensor::Tensor shard_grad_;
  // zero3: this replica's chunks of the stage's values (what the optimiser updates), the
  // gathers in flight (one per unit, waited for in order), and whether the flat buffer holds
  // the current values.
  tensor::Tensor shard_values_;
  std::vector<comm::Work> gathers_;
  size_t waited_ = 0;
  bool gathering_ = false, gathered_ = true;
  std::vector<size_t> piece_end_;  // per piece of the stage: where its parameters end
  bool grads_zero_ = true;  // the stage's flat gradients are zero (dropped pages read as zero)
  nn::OptimTarget target_;
  tensor::Shape in_shape_, out_shape_;  // this stage's, per micro-batch
  std::unique_ptr<Channel> act_in_, act_out_, grad_in_, grad_out_;
  std::vector<std::unique_ptr<Micro>> micro_;
  std::vector<Action> actions_;
  float loss_sum_ = 0;
  StageStats stats_;
};

}  // namespace cohort::dist
