// `cohort bench train --pipeline-stages S`: pipelined steps on synthetic data, timed; prints
// the cut, every stage's compute, idle, send and allreduce time, the measured bubble next to
// the formula, the peak activations per stage, and writes JSON.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/dist/pipeline.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/train/metrics.h"
#include "run.h"

namespace cohort::train {

BenchTrainResult bench_pipeline(const BenchTrainOptions& o) {
  const dist::PipelineOptions& po = o.pipeline;
  COHORT_CHECK(o.steps > 0 && o.warmup >= 0 && o.batch > 0,
               "bench train: steps " << o.steps << ", warmup " << o.warmup);
  COHORT_CHECK(
      o.batch % po.micro_batches == 0,
      "--batch " << o.batch << " is not a multiple of --micro-batches " << po.micro_batches);
  comm::JobEnv job = comm::detect_job_env();
  default_threads(o.threads, job);
  choose_device(o.device, job);
  std::shared_ptr<comm::Communicator> world = comm::init();
  const bool lead = job.rank == 0;
  const std::string precision_note = apply_precision(o.precision);
  auto model =
      nn::make_model(o.model, nn::ModelOptions{o.in_channels, o.num_classes, o.image_size, 0});
  const int micro = o.batch / po.micro_batches;
  dist::PipelineOptions piped = po;
  piped.shard = o.ddp.shard;
  dist::Pipeline pipe(*model, world, piped, {micro, o.in_channels, o.image_size, o.image_size});
  nn::OptimOptions oo;
  oo.kind = o.optimizer;
  auto opt = nn::make_optimizer(pipe.optim_target(), oo);
  // One mini-batch per replica: the first stage reads the images, the last the labels.
  Tensor x = Tensor::empty({o.batch, o.in_channels, o.image_size, o.image_size});
  nn::init::normal(x, 0.0, 1.0, 17 + static_cast<uint64_t>(pipe.replica()));
  x = x.channels_last();
  std::vector<int> labels;
  for (int i = 0; i < o.batch; ++i) labels.push_back((i * 7919 + pipe.replica()) % o.num_classes);
  auto loss = [&](const nn::Var& logits, int i) {
    return nn::cross_entropy(
        logits, std::vector<int>(labels.begin() + i * micro, labels.begin() + (i + 1) * micro));
  };
  if (lead) {
    std::printf(
        "# cohort bench train: %s, batch %d per replica, %dx%dx%d, %d rank(s), %d threads "
        "per rank, %s, %d steps after %d warmup\n",
        o.model.c_str(), o.batch, o.in_channels, o.image_size, o.image_size, job.world,
        tensor::threads(), o.optimizer.c_str(), o.steps, o.warmup);
    std::printf("# precision %s\n# pipeline: %s\n", precision_note.c_str(),
                pipe.describe().c_str());
    std::fflush(stdout);
  }
  for (int i = 0; i < o.warmup; ++i) {
    pipe.zero_grad();
    pipe.run(x, loss);
    pipe.finish();
    opt->step(0.01f);
    pipe.after_step();
  }
  world->barrier().wait();
  pipe.reset_stats();
  std::vector<double> ms;
  double optimizer_s = 0;
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = Clock::now();
    pipe.zero_grad();
    const float l = pipe.run(x, loss);
    pipe.finish();
    auto t1 = Clock::now();
    opt->step(0.01f);
    pipe.after_step();
    optimizer_s += seconds_since(t1);
    ms.push_back(1e3 * seconds_since(t0));
    if (o.max_memory > 0) {
      check_memory_cap(gather_reports(pipe.memory(*opt), world.get()), o.max_memory, i);
    }
    COHORT_CHECK(std::isfinite(l), "bench train: loss " << l << " at step " << i);
  }
  const std::vector<dist::StageStats> stats = pipe.gather_stats();
  const std::vector<dist::MemoryReport> memory = gather_reports(pipe.memory(*opt), world.get());
  BenchTrainResult r;
  r.lead = lead;
  r.world = job.world;
  const std::vector<double> per_rank =
      time_steps(r, ms, world.get(), static_cast<double>(o.batch) * pipe.replicas());
  r.ms_optimizer = 1e3 * optimizer_s / o.steps;
  r.memory = memory.front();
  if (!lead) return r;

  const double formula = dist::bubble_formula(pipe.stages(), po.micro_batches);
  double bubble = 0;
  std::printf("%-6s %-7s %9s %9s %9s %9s %9s %9s %7s %10s %8s\n", "rank", "stage", "step ms",
              "compute", "idle", "send", "reduce", "gather", "bubble", "act. MB", "in flight");
  nlohmann::json per = nlohmann::json::array();
  for (size_t k = 0; k < stats.size(); ++k) {
    const dist::StageStats& s = stats[k];
    const double n = std::max(1, s.steps);
    bubble += s.bubble() / static_cast<double>(stats.size());
    std::printf("%-6zu %-7d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %6.1f%% %10.1f %8d\n", k,
                static_cast<int>(k) % pipe.stages(), 1e3 * s.step_s / n, 1e3 * s.compute_s / n,
                1e3 * s.idle_s / n, 1e3 * s.send_s / n, 1e3 * s.reduce_s / n, 1e3 * s.gather_s / n,
                100 * s.bubble(), s.peak_activations / 1e6, s.peak_in_flight);
    per.push_back({{"rank", k},
                   {"stage", static_cast<int>(k) % pipe.stages()},
                   {"ms_schedule", 1e3 * s.step_s / n},
                   {"ms_compute", 1e3 * s.compute_s / n},
                   {"ms_idle", 1e3 * s.idle_s / n},
                   {"ms_send_wait", 1e3 * s.send_s / n},
                   {"ms_allreduce_wait", 1e3 * s.reduce_s / n},
                   {"ms_gather_wait", 1e3 * s.gather_s / n},
                   {"bubble", s.bubble()},
                   {"peak_activation_bytes", s.peak_activations},
                   {"peak_in_flight", s.peak_in_flight}});
  }
  std::printf(
      "ms/step %.1f (min %.1f)  images/s %.2f (all replicas)  bubble measured %.1f%% (mean of "
      "the stages), formula (S-1)/(M+S-1) %.1f%%  optimizer %.1f ms  peak RSS %.0f MB\n",
      r.ms_per_step, r.ms_min, r.images_per_s, 100 * bubble, 100 * formula, r.ms_optimizer,
      r.peak_rss / 1e6);
  std::printf("%s", dist::memory_table(memory).c_str());
  if (!o.json.empty()) {
    nlohmann::json j = bench_json(o, r, ms, per_rank);
    j.update({{"pipeline",
               {{"stages", pipe.stages()},
                {"replicas", pipe.replicas()},
                {"micro_batches", po.micro_batches},
                {"schedule", dist::schedule_name(po.schedule)},
                {"cuts", pipe.cuts()},
                {"deferred_batch_norm", po.deferred_batch_norm},
                {"recompute", po.recompute},
                {"bubble_measured", bubble},
                {"bubble_formula", formula},
                {"per_rank", per}}},
              {"parameters", model->num_parameters()},
              {"memory", memory_json(memory)}});
    write_bench_json(o.json, j);
  }
  return r;
}

}  // namespace cohort::train
