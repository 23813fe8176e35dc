// `cohort bench train`: forward + backward + optimiser steps on synthetic data, timed, with the
// time per kind of op; under a launcher with DDP, the global images/s and every rank's step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/train/metrics.h"
#include "run.h"

namespace cohort::train {

std::vector<double> time_steps(BenchTrainResult& r, const std::vector<double>& ms,
                               comm::Communicator* world, double samples) {
  double sum = 0;
  for (double v : ms) sum += v;
  r.ms_per_step = sum / static_cast<double>(ms.size());
  r.ms_min = *std::min_element(ms.begin(), ms.end());
  std::vector<double> per_rank(world ? static_cast<size_t>(world->size()) : 1, r.ms_per_step);
  if (world) world->allgather(&r.ms_per_step, per_rank.data(), 1, comm::DataType::f64).wait();
  r.images_per_s = 1e3 * samples / *std::max_element(per_rank.begin(), per_rank.end());
  r.peak_rss = peak_rss_bytes();
  r.threads = tensor::threads();
  return per_rank;
}

nlohmann::json bench_json(const BenchTrainOptions& o, const BenchTrainResult& r,
                          const std::vector<double>& ms, const std::vector<double>& per_rank) {
  return {{"model", o.model},
          {"batch", o.batch},
          {"image_size", o.image_size},
          {"in_channels", o.in_channels},
          {"threads", r.threads},
          {"world", r.world},
          {"precision", precision_name(o.precision)},
          {"steps", o.steps},
          {"warmup", o.warmup},
          {"ms_per_step", r.ms_per_step},
          {"ms_per_step_per_rank", per_rank},
          {"ms_min", r.ms_min},
          {"ms_each", ms},
          {"images_per_s", r.images_per_s},
          {"ms_optimizer", r.ms_optimizer},
          {"peak_rss_bytes", r.peak_rss}};
}

void write_bench_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  if (!f) COHORT_THROW("cannot write --json file '" << path << "'");
  f << j.dump(2) << "\n";
}

BenchTrainResult bench_train(const BenchTrainOptions& o) {
  if (o.pipeline.stages > 0) return bench_pipeline(o);
  COHORT_CHECK(o.steps > 0 && o.warmup >= 0 && o.batch > 0,
               "bench train: steps " << o.steps << ", warmup " << o.warmup);
  comm::JobEnv job = comm::detect_job_env();
  default_threads(o.threads, job);
  choose_device(o.device, job);
  std::shared_ptr<comm::Communicator> world;
  if (job.world > 1) world = comm::init();
  const bool lead = job.rank == 0;
  const std::string precision_note = apply_precision(o.precision);
  auto model =
      nn::make_model(o.model, nn::ModelOptions{o.in_channels, o.num_classes, o.image_size, 0});
  nn::OptimOptions oo;
  oo.kind = o.optimizer;
  COHORT_CHECK(world || o.ddp.shard == dist::Shard::none,
               "--shard " << dist::shard_name(o.ddp.shard) << " needs several ranks");
  dist::check_fits(*model, job.world, job.local_world, o.ddp.shard,
                   state_bytes(o.optimizer, oo.momentum), o.ddp, o.max_memory);
  std::unique_ptr<dist::DataParallel> dp;
  dist::DdpOptions dpo = o.ddp;
  // --no-sync: the sharded modes keep their gradients local too (nothing is reduced).
  if (o.no_sync) dpo.accumulate_locally = true;
  if (world) dp = dist::make_data_parallel(*model, world, dpo);
  auto opt = nn::make_optimizer(dp ? dp->optim_target() : nn::whole_model(*model), oo);
  Tensor x = Tensor::empty({o.batch, o.in_channels, o.image_size, o.image_size});
  nn::init::normal(x, 0.0, 1.0, 17 + static_cast<uint64_t>(job.rank));
  x = x.channels_last();
  Targets t;
  for (int i = 0; i < o.batch; ++i) t.classes.push_back((i * 7919 + job.rank) % o.num_classes);

  if (lead) {
    std::printf(
        "# cohort bench train: %s, batch %d per rank, %dx%dx%d, %d rank(s), %d threads "
        "per rank, %s, %d steps after %d warmup\n",
        o.model.c_str(), o.batch, o.in_channels, o.image_size, o.image_size, job.world,
        tensor::threads(), o.optimizer.c_str(), o.steps, o.warmup);
    std::printf("# precision %s\n", precision_note.c_str());
    if (dp) {
      std::printf("# %s%s\n", dp->describe().c_str(),
                  o.no_sync ? "; --no-sync: no gradient is reduced" : "");
    }
  }
  for (int i = 0; i < o.warmup; ++i)
    train_step(*model, *opt, x, t, 0.01f, 0.0f, nullptr, dp.get(), !o.no_sync);
  if (world) world->barrier().wait();
  nn::profile::reset();
  nn::profile::enable(o.profile);
  nn::timeline::reset();
  nn::timeline::enable(o.timeline);
  StepTimes times;
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = Clock::now();
    const float loss = train_step(*model, *opt, x, t, 0.01f, 0.0f, &times, dp.get(), !o.no_sync);
    ms.push_back(1e3 * seconds_since(t0));
    if (o.max_memory > 0)
      check_memory_cap(gather_memory(*model, dp.get(), *opt, world.get()), o.max_memory, i);
    COHORT_CHECK(std::isfinite(loss), "bench train: loss " << loss << " at step " << i);
  }
  nn::profile::enable(false);
  nn::timeline::enable(false);
  BenchTrainResult r;
  r.lead = lead;
  if (o.timeline) {
    r.ops = nn::timeline::entries();
    r.timed_steps = nn::timeline::steps();
  }
  r.world = job.world;
  const std::vector<double> per_rank =
      time_steps(r, ms, world.get(), static_cast<double>(o.batch) * job.world);
  r.ms_forward = 1e3 * times.forward / o.steps;
  r.ms_backward = 1e3 * times.backward / o.steps;
  r.ms_optimizer = 1e3 * times.optimizer / o.steps;
  r.ms_comm_wait = 1e3 * times.comm_wait / o.steps;
  const std::vector<dist::MemoryReport> memory = gather_memory(*model, dp.get(), *opt, world.get());
  const dist::Traffic sent = dp ? dp->traffic() : dist::Traffic();
  r.memory = memory.front();
  r.sent = sent;
  if (!lead) return r;
  const tensor::AllocatorStats mem = tensor::Allocator::cpu().stats();
  std::printf(
      "ms/step %.1f (min %.1f)  images/s %.2f%s  forward %.1f  backward %.1f  exposed "
      "comm %.1f  optimizer %.1f ms  peak RSS %.0f MB (tensors at most %.0f MB)\n",
      r.ms_per_step, r.ms_min, r.images_per_s, job.world > 1 ? " (all ranks)" : "", r.ms_forward,
      r.ms_backward, r.ms_comm_wait, r.ms_optimizer, r.peak_rss / 1e6, mem.peak_in_use / 1e6);
  if (job.world > 1) {
    std::printf("ms/step per rank:");
    for (double v : per_rank) std::printf(" %.1f", v);
    std::printf("\n");
    std::printf(
        "sent per step by rank 0: allreduce %.1f MB, reduce-scatter %.1f MB, allgather %.1f MB "
        "(between hosts %.1f MB); %lld parameters = %.1f MB in f32\n",
        sent.allreduce / 1e6, sent.reduce_scatter / 1e6, sent.allgather / 1e6,
        sent.across_hosts / 1e6, static_cast<long long>(model->num_parameters()),
        4e-6 * static_cast<double>(model->num_parameters()));
    std::printf("%s", dist::memory_table(memory).c_str());
  }
  nlohmann::json split = nlohmann::json::array();
  if (o.profile) {
    std::printf("%-14s %10s %7s %8s\n", "op", "ms/step", "share", "calls");
    for (const auto& e : nn::profile::entries()) {
      const double per = 1e3 * e.seconds / o.steps;
      std::printf("%-14s %10.2f %6.1f%% %8llu\n", e.op.c_str(), per, 100 * per / r.ms_per_step,
                  static_cast<unsigned long long>(e.calls / o.steps));
      split.push_back({{"op", e.op}, {"ms_per_step", per}, {"calls_per_step", e.calls / o.steps}});
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j = bench_json(o, r, ms, per_rank);
    j.update({{"no_sync", o.no_sync},
              {"ms_forward", r.ms_forward},
              {"ms_backward", r.ms_backward},
              {"ms_comm_wait", r.ms_comm_wait},
              {"peak_tensor_bytes", mem.peak_in_use},
              {"shard", dist::shard_name(o.ddp.shard)},
              {"parameters", model->num_parameters()},
              {"memory", memory_json(memory)},
              {"sent_bytes",
               {{"allreduce", sent.allreduce},
                {"reduce_scatter", sent.reduce_scatter},
                {"allgather", sent.allgather},
                {"across_hosts", sent.across_hosts}}},
              {"split", split}});
    write_bench_json(o.json, j);
  }
  return r;
}

}  // namespace cohort::train
