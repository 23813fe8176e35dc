// The parts of a training run, internal to train. set_up() builds everything the loop reads
// (setup.cc); the loop itself is run_training (trainer.cc); the step (step.cc), validation
// (evaluate.cc), checkpointing (checkpointing.cc), loss scaling (loss_scaler.cc) and the
// progress meter (progress.cc) are its named parts.
#pragma once

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/data/pipeline.h"
#include "cohort/data/source.h"
#include "cohort/dist/checkpoint.h"
#include "cohort/dist/data_parallel.h"
#include "cohort/dist/pipeline.h"
#include "cohort/dist/step_memory.h"
#include "cohort/nn/model.h"
#include "cohort/nn/optim.h"
#include "cohort/train/config.h"
#include "cohort/train/trainer.h"

namespace cohort::train {

struct Run {
  TrainConfig c;
  comm::JobEnv job;
  std::shared_ptr<comm::Communicator> world;  // null with one rank
  bool lead = true;                           // rank 0 prints and writes
  std::shared_ptr<data::Source> source;
  int classes = 0, in_channels = 0;
  std::unique_ptr<data::Pipeline> train, val;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<nn::Optimizer> opt;
  std::unique_ptr<dist::DataParallel> dp;  // with several ranks: DDP or a sharded mode
  std::unique_ptr<dist::Pipeline> pipe;    // --pipeline-stages: this rank's stage (dp is null)
  nn::OptimTarget target;                  // what this rank's optimiser updates
  int64_t per_epoch = 0;                   // optimiser steps per epoch
  int64_t total = 0;                       // steps of the whole run
  int64_t global_batch = 0;                // samples per optimiser step, all ranks
  float lr = 0;                            // after the scaling rule
  nn::LrSchedule sched;
  dist::RunPosition pos;  // where the run starts (after a resume: the checkpoint's)
  std::string precision_note;
  std::vector<std::string> class_names;  // from the data where it names them (may be empty)
  // After a restart (COHORT_RESTART_COUNT > 0): the generation and its times (unix seconds),
  // completed by the loop and written to the JSON log.
  nlohmann::json restart;

  // printf on rank 0 only.
  template <class... A>
  void say(const char* fmt, A... args) const {
    if (!lead) return;
    if constexpr (sizeof...(A) == 0) {
      std::fputs(fmt, stdout);
    } else {
      std::printf(fmt, args...);
    }
    std::fflush(stdout);
  }
};

// Everything before the first step: the world, threads, precision, data, model, optimiser,
// DDP, the schedule and the resume; prints what the run is.
Run set_up(const TrainConfig& c);

// cohort bench train with --pipeline-stages.
BenchTrainResult bench_pipeline(const BenchTrainOptions& o);
// Shared by both: fills r's step times from ms (this rank's steps) and returns every rank's
// mean (collective over world, when there is one); the slowest sets r.images_per_s, for
// `samples` samples per step over all ranks.
std::vector<double> time_steps(BenchTrainResult& r, const std::vector<double>& ms,
                               comm::Communicator* world, double samples);
// The fields every bench train JSON holds; and writing it to --json.
nlohmann::json bench_json(const BenchTrainOptions& o, const BenchTrainResult& r,
                          const std::vector<double>& ms, const std::vector<double>& per_rank);
void write_bench_json(const std::string& path, const nlohmann::json& j);

// Shared by cohort train and cohort bench train.
void default_threads(int asked, const comm::JobEnv& job);
std::string apply_precision(Precision p);  // sets the compute type; says what runs in what
// --device: cpu, or this rank's GPU (its local rank's, as torchrun's users expect). Throws a
// clear error where there is no usable GPU, naming why.
std::string choose_device(tensor::Device d, const comm::JobEnv& job);

// A pipeline batch as the model's input (a view, no copy) and its targets.
Tensor batch_tensor(const data::Batch& b);
Targets batch_targets(const data::Batch& b, bool multilabel, int classes);

// One mini-batch through the pipeline: the first stage's images x, the last stage's targets t,
// both split into micro_batches; the loss gradient seeded with loss_scale. Returns the mean loss.
float pipeline_forward_backward(dist::Pipeline& p, const Tensor& x, const Targets& t,
                                int micro_batches, float label_smoothing, float loss_scale);

// Writes a checkpoint at `at` (every rank its shard, when --checkpoint-dir is set) and says so.
void write_checkpoint(const Run& r, const dist::RunPosition& at);
// Where the run stands after `step` steps, `in_epoch` of them in `epoch`.
dist::RunPosition position_after(const Run& r, int64_t step, int64_t epoch, int64_t in_epoch);

// The memory report of every rank (collective), as the table printed and as JSON.
// One process (dp null): the model state, with what `steps` measured a step to add (activations,
// allocator cache) where given, and the kernel's peak RSS.
std::vector<dist::MemoryReport> gather_memory(const nn::Model& m, dist::DataParallel* dp,
                                              const nn::Optimizer& opt, comm::Communicator* world,
                                              const dist::StepMemory* steps = nullptr);
// Every rank's report (this rank's is r, with the kernel's peak RSS added), by rank.
std::vector<dist::MemoryReport> gather_reports(dist::MemoryReport r, comm::Communicator* world);
nlohmann::json memory_json(const std::vector<dist::MemoryReport>& ranks);
// Stops the run with the report when a rank's accounted memory, or the kernel's peak RSS, passed
// --max-memory.
void check_memory_cap(const std::vector<dist::MemoryReport>& ranks, uint64_t cap, int64_t step);
// Optimiser state bytes per parameter element for an optimiser kind (K of the ZeRO paper).
int state_bytes(const std::string& optimizer, float momentum);

}  // namespace cohort::train
