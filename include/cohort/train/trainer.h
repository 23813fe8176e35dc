// The training loop behind `cohort train` and `cohort bench train`: batches from the data
// pipeline (channels-last f32, straight from its buffers), forward, loss, backward on a tape,
// optimiser step on the flat buffers, progress lines, per-epoch validation, a JSON log.
#pragma once

#include <string>
#include <vector>

#include "cohort/data/pipeline.h"
#include "cohort/dist/data_parallel.h"
#include "cohort/dist/pipeline.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"
#include "cohort/train/config.h"

namespace cohort::train {

using nn::Tensor;

// The targets of one batch: class indices, or a [N, K] 0/1 matrix for multi-label findings.
struct Targets {
  std::vector<int> classes;
  Tensor multilabel;
};

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0, comm_wait = 0;
};

// Forward and backward of one micro-batch, adding its gradients (of loss x loss_scale) into
// the model's flat gradient buffer; `dp`, when given, is armed on the tape first (sync: this
// micro-batch's gradients are communicated; dp scales the loss gradient for the average over
// ranks). Returns the batch's loss.
float forward_backward(nn::Model& m, const Tensor& x, const Targets& t, float label_smoothing,
                       float loss_scale, dist::DataParallel* dp, bool sync, StepTimes* times);

// One optimisation step on one batch: zero, forward, backward, (dp's finish), optimiser, (dp's
// after_step). With sync = false, DDP communicates nothing (as PyTorch's no_sync()): what the
// step costs without its allreduces, for measuring what they cost.
float train_step(nn::Model& m, nn::Optimizer& opt, const Tensor& x, const Targets& t, float lr,
                 float label_smoothing, StepTimes* times = nullptr,
                 dist::DataParallel* dp = nullptr, bool sync = true);

struct EvalResult {
  double loss = 0, accuracy = 0, auc = 0;  // auc: binary or mean over findings; NaN if undefined
  std::vector<double> auc_per_finding;     // multi-label: one per finding (NaN: one class only)
  size_t samples = 0;
};

// Validation over a pipeline (sharded by rank when `world` has several): every rank returns the
// same figures over each sample once.
EvalResult evaluate(nn::Model& m, data::Pipeline& p, bool multilabel, int classes,
                    comm::Communicator* world = nullptr);

struct TrainSummary {
  int64_t steps = 0;
  int64_t first_step = 0;     // > 0 when resumed
  std::vector<float> losses;  // every step's loss (rank 0's batch)
  double final_loss = 0;
  double images_per_s = 0;
  double seconds = 0;
  EvalResult last_val;
  bool has_val = false;
  int64_t skipped_steps = 0;  // f16: steps dropped for inf/nan gradients
};

TrainSummary run_training(const TrainConfig& c);

struct BenchTrainOptions {
  std::string model = "resnet18";
  int batch = 16, image_size = 128, in_channels = 3, num_classes = 1000;
  int steps = 10, warmup = 3, threads = 0;
  std::string optimizer = "sgd";
  std::string json;
  bool profile = true;             // time every kind of op and report the split
  bool timeline = false;           // time every op the tape records (result.ops): --profile FILE
  bool no_sync = false;            // no gradient reduction (the step's cost without it)
  dist::DdpOptions ddp;            // under a launcher with several ranks: the mode and its options
  dist::PipelineOptions pipeline;  // stages > 0: pipelined (bench_pipeline)
  uint64_t max_memory = 0;
  Precision precision = Precision::f32;
  tensor::Device device = tensor::Device::cpu;
};

struct BenchTrainResult {
  double ms_per_step = 0, ms_min = 0, images_per_s = 0;  // images/s: global, all ranks
  double ms_forward = 0, ms_backward = 0, ms_optimizer = 0, ms_comm_wait = 0;
  int world = 1;
  size_t peak_rss = 0;
  int threads = 0;
  dist::MemoryReport memory;              // this rank's
  dist::Traffic sent;                     // the last step's, this rank
  bool lead = false;                      // this rank reports (rank 0)
  std::vector<nn::timeline::OpTime> ops;  // with BenchTrainOptions::timeline, over `steps`
  int timed_steps = 0;
};

// Synthetic data, timed steps; prints a table (the per-op split too) and writes JSON.
BenchTrainResult bench_train(const BenchTrainOptions& o);

}  // namespace cohort::train
