// `cohort train`'s loop, top to bottom: set up, then per step the micro-batches (data, forward,
// backward), DDP's finish, loss scaling, clipping and the optimiser, the progress meter and
// checkpoints; per epoch validation; at the end the summary, the final checkpoint, the weights
// and the JSON log.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/safetensors.h"
#include "cohort/train/loss_scaler.h"
#include "cohort/train/metrics.h"
#include "cohort/train/report.h"
#include "progress.h"
#include "run.h"

namespace cohort::train {

namespace {

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nullptr;
}

nlohmann::json config_json(const Run& r) {
  nlohmann::json log = nlohmann::json::object();
  nlohmann::json cfg = nlohmann::json::object();
  for (const ConfigKey& k : train_config_keys()) cfg[k.name] = k.get(r.c);
  log["config"] = cfg;
  log["world"] = r.job.world;
  log["global_batch"] = r.global_batch;
  log["lr_effective"] = r.lr;
  log["parameters"] = r.model->num_parameters();
  log["epochs"] = nlohmann::json::array();
  return log;
}

// Validation after an epoch: rank 0's BatchNorm statistics first (as DDP's broadcast_buffers),
// then every rank's shard; prints and returns the figures for the log.
nlohmann::json validate(Run& r, int64_t epoch, TrainSummary& s) {
  if (r.dp) r.dp->broadcast_buffers();
  if (r.pipe) r.pipe->gather_model();  // every rank evaluates its shard on the whole model
  const EvalResult e = evaluate(*r.model, *r.val, r.c.multilabel, r.classes, r.world.get());
  s.last_val = e;
  s.has_val = true;
  r.say("epoch %lld/%d validation: %zu samples, loss %.4f", static_cast<long long>(epoch + 1),
        r.c.epochs, e.samples, e.loss);
  if (std::isfinite(e.accuracy)) r.say(", accuracy %.4f", e.accuracy);
  if (std::isfinite(e.auc)) r.say(", ROC AUC %.4f", e.auc);
  // Multi-label: each finding's AUROC, named from the data (CheXNet-style reports compare these).
  nlohmann::json per = nlohmann::json::object();
  for (size_t k = 0; k < e.auc_per_finding.size(); ++k) {
    const std::string name =
        k < r.class_names.size() ? r.class_names[k] : "finding " + std::to_string(k);
    per[name] = finite_or_null(e.auc_per_finding[k]);
    r.say("%s %s %.4f", k == 0 ? " (mean of" : ",", name.c_str(), e.auc_per_finding[k]);
  }
  if (!e.auc_per_finding.empty()) r.say(")");
  r.say("\n");
  nlohmann::json out = {{"val_loss", e.loss},
                        {"val_accuracy", finite_or_null(e.accuracy)},
                        {"val_auc", finite_or_null(e.auc)}};
  if (!per.empty()) out["val_auc_per_finding"] = per;
  return out;
}

// Every rank's memory report: the engine's under data parallelism, the stage's under a pipeline,
// and in one process the model state with what `steps` measured a step to add.
std::vector<dist::MemoryReport> memory_of(const Run& r, const dist::StepMemory& steps) {
  if (r.pipe) return gather_reports(r.pipe->memory(*r.opt), r.world.get());
  return gather_memory(*r.model, r.dp.get(), *r.opt, r.world.get(), r.dp ? nullptr : &steps);
}

// --baseline-json: this run's images/s against a smaller run's, per rank.
double scaling_efficiency(const Run& r, double images_per_s) {
  const std::string& path = r.c.baseline_json;
  std::ifstream in(path);
  COHORT_CHECK(in, "cannot read --baseline-json " << path);
  nlohmann::json base;
  try {
    base = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    COHORT_THROW("--baseline-json " << path << " is not JSON: " << e.what());
  }
  COHORT_CHECK(base.contains("summary") && base["summary"].contains("images_per_s"),
               path << " is not a cohort train --json log");
  const double b1 = base["summary"]["images_per_s"].get<double>();
  const int bw = base.value("world", 1);
  const double eff = images_per_s / (b1 / bw * r.job.world);
  r.say("train: scaling efficiency %.3f against %s (%.1f images/s on %d rank(s))\n", eff,
        path.c_str(), b1, bw);
  return eff;
}

}  // namespace

TrainSummary run_training(const TrainConfig& config) {
  Run r = set_up(config);
  const TrainConfig& c = r.c;
  nlohmann::json summary_extra = nlohmann::json::object();
  LossScaler scaler(c.precision == Precision::f16, c.loss_scale);
  ProgressMeter meter(r);
  dist::StepMemory step_memory;  // one process: what a step allocates (DDP and ZeRO keep theirs)
  nlohmann::json log = config_json(r);
  TrainSummary s;
  s.first_step = r.pos.step;
  int64_t step = r.pos.step, epoch = r.pos.epoch, in_epoch = 0;
  const int data_world = static_cast<int>(r.global_batch / (int64_t{c.batch} * c.accum_steps));
  std::ofstream sample_log;  // --sample-log: the data set indices of every micro-batch
  if (!c.sample_log.empty()) {
    const std::string path = c.sample_log + ".rank" + std::to_string(r.job.rank);
    sample_log.open(path);
    COHORT_CHECK(sample_log, "cannot write --sample-log " << path);
  }
  for (; epoch < c.epochs && step < r.total; ++epoch) {
    const uint64_t from = epoch == r.pos.epoch ? r.pos.position : 0;
    // A resume off this layout's global batches (set_up's place_resume chose exact): the first
    // step trains the positions left of it, [from, from + short_samples): the rest of a
    // micro-batch, [from, partial_end), dealt over the ranks from `from` (a rank may get fewer
    // samples, or none), then the step's remaining whole micro-batches. Its loss is averaged
    // over those samples: each micro-batch's mean weighs its samples' share of the step.
    const uint64_t gb = static_cast<uint64_t>(r.global_batch);
    const uint64_t micro = static_cast<uint64_t>(c.batch) * static_cast<uint64_t>(data_world);
    uint64_t short_samples = 0, partial_end = 0;
    int first_micro = 0;
    if (from % gb != 0) {
      COHORT_CHECK(!r.pipe, "a pipeline resumes at whole steps only, not at position " << from);
      const uint64_t total = r.train->sampler().total_size();
      short_samples = std::min(from - from % gb + gb, total) - from;
      first_micro = static_cast<int>(from % gb / micro);
      if (from % micro != 0) partial_end = std::min(from - from % micro + micro, total);
    }
    r.train->start_epoch(static_cast<uint64_t>(epoch), from, partial_end ? partial_end : SIZE_MAX);
    double epoch_loss = 0;
    int64_t epoch_steps = 0;
    in_epoch = static_cast<int64_t>(from / static_cast<uint64_t>(r.global_batch));
    data::Batch b;
    while (step < r.total && in_epoch < r.per_epoch) {
      // Micro-batches: gradients accumulate; only the last one communicates.
      double data_s = 0, comm_s = 0;
      auto t_step = Clock::now();
      const bool measure_memory = !r.dp && !r.pipe;
      if (measure_memory) step_memory.begin();
      if (r.dp) {
        r.dp->zero_grad();
      } else if (r.pipe) {
        r.pipe->zero_grad();
      } else {
        r.model->zero_grad();
      }
      float loss = 0;
      int images = 0;
      const bool short_step = short_samples > 0;
      double short_loss = 0;  // this rank's loss summed over its samples of a short step
      for (int k = short_step ? first_micro : 0; k < c.accum_steps; ++k) {
        auto t0 = Clock::now();
        const bool partial = partial_end > 0 && k == first_micro;
        const bool have = r.train->next(&b);
        COHORT_CHECK(have || partial, "rank " << r.job.rank << " ran out of data at step " << step
                                              << " of epoch " << epoch);
        data_s += seconds_since(t0);
        const int n = have ? b.size : 0;
        if (sample_log.is_open()) {
          sample_log << epoch << ' ' << step << ' ' << k;
          for (int i = 0; i < n; ++i) sample_log << ' ' << b.indices[i];
          sample_log << '\n';
        }
        const float scale = short_step
                                ? scaler.scale() * static_cast<float>(data_world) *
                                      static_cast<float>(n) / static_cast<float>(short_samples)
                                : scaler.scale() / static_cast<float>(c.accum_steps);
        Tensor x;
        Targets t;
        if (have) {
          x = batch_tensor(b);
          t = batch_targets(b, c.multilabel, r.classes);
        } else {
          // No sample for this rank: a stand-in image of zeros with no weight in the loss, so
          // that its forward and backward still take part in every collective of the step.
          x = Tensor::zeros({1, r.in_channels, c.image_size, c.image_size}, tensor::DType::f32,
                            tensor::Order::channels_last);
          if (c.multilabel) {
            t.multilabel = Tensor::zeros({1, r.classes});
          } else {
            t.classes = {0};
          }
        }
        if (r.pipe) {
          loss +=
              pipeline_forward_backward(*r.pipe, x, t, c.micro_batches, c.label_smoothing, scale) /
              static_cast<float>(c.accum_steps);
        } else {
          // The stand-in must not move this rank's BatchNorm running statistics.
          std::optional<nn::FrozenBatchNormStatistics> frozen;
          if (!have) frozen.emplace();
          const float value = forward_backward(*r.model, x, t, c.label_smoothing, scale, r.dp.get(),
                                               k == c.accum_steps - 1, nullptr);
          frozen.reset();
          if (short_step) {
            short_loss += static_cast<double>(value) * n;
          } else {
            loss += value / static_cast<float>(c.accum_steps);
          }
        }
        images += n;
        // The leftover micro-batch done, the epoch goes on at the next micro-batch boundary.
        if (partial) r.train->start_epoch(static_cast<uint64_t>(epoch), partial_end);
      }
      if (short_step) loss = images > 0 ? static_cast<float>(short_loss / images) : 0.0f;
      const uint64_t step_images =
          short_step ? short_samples
                     : static_cast<uint64_t>(images) * static_cast<uint64_t>(data_world);
      short_samples = 0;
      partial_end = 0;
      if (r.dp) comm_s = r.dp->finish();
      if (r.pipe) comm_s = r.pipe->finish();
      // Loss scaling, clipping (over every rank's shard), the optimiser, the updated shards out.
      const float lr = r.sched.at(step);
      const float scale = scaler.scale();
      if (scaler.unscale(r.target)) {
        if (c.clip_grad_norm > 0) nn::clip_grad_norm(r.target, c.clip_grad_norm);
        r.opt->step(lr);
        if (r.dp) r.dp->after_step();
        if (r.pipe) r.pipe->after_step();
      } else {
        r.say(
            "train: step %lld: gradients overflow f16 at loss scale %g; step skipped, scale now "
            "%g\n",
            static_cast<long long>(step + 1), scale, scaler.scale());
      }
      if (measure_memory) step_memory.end();
      const double compute_s = seconds_since(t_step) - data_s - comm_s;
      COHORT_CHECK(std::isfinite(loss), "loss is " << loss << " at step " << step << " (lr " << lr
                                                   << "): training diverged");
      ++step;
      ++epoch_steps;
      if (!r.restart.is_null() && !r.restart.contains("first_step_at")) {
        // The time the restart cost: from the failure the launcher saw to this first step.
        const double now = unix_seconds(), failed = r.restart["failed_at"].get<double>();
        r.restart["first_step_at"] = now;
        r.restart["lost_seconds"] = failed > 0 ? now - failed : 0.0;
        r.say(
            "train: restart: generation %d resumed at step %lld; %.1f s from the failure to this "
            "step (set-up and resume %.1f s of it)\n",
            r.restart["generation"].get<int>(), static_cast<long long>(step),
            r.restart["lost_seconds"].get<double>(),
            r.restart["set_up_at"].get<double>() - r.restart["started_at"].get<double>());
      }
      ++in_epoch;
      s.losses.push_back(loss);
      s.final_loss = loss;
      epoch_loss += loss;
      meter.record({step, epoch, loss, lr, compute_s, comm_s, data_s, step_images,
                    r.dp ? r.dp->traffic() : dist::Traffic()});
      if (c.max_memory > 0) check_memory_cap(memory_of(r, step_memory), c.max_memory, step);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0 && step < r.total) {
        write_checkpoint(r, position_after(r, step, epoch, in_epoch));
      }
    }
    nlohmann::json ej = {{"epoch", epoch},
                         {"train_loss", epoch_steps ? epoch_loss / epoch_steps : 0.0},
                         {"steps", epoch_steps}};
    if (r.val && in_epoch == r.per_epoch) ej.update(validate(r, epoch, s));
    log["epochs"].push_back(ej);
    if (step >= r.total) break;  // `epoch` stays the one the last step belongs to
  }
  if (r.world) r.world->barrier().wait();  // every rank's last step is done before the summary

  // The summary.
  s.steps = step;
  s.seconds = meter.seconds();
  const int64_t ran = step - s.first_step;
  s.images_per_s = static_cast<double>(meter.images()) / s.seconds;
  s.skipped_steps = scaler.skipped_steps();
  const data::PipelineStats ps = r.train->stats();
  r.say(
      "train: %lld steps in %.1f s, %.1f images/s (all ranks), final loss %.4f, peak RSS %.0f "
      "MB, %llu unreadable samples skipped\n",
      static_cast<long long>(ran), s.seconds, s.images_per_s, s.final_loss, peak_rss_bytes() / 1e6,
      static_cast<unsigned long long>(ps.skipped));
  if (ran > 0) {
    r.say("train: per step: compute %.1f ms, exposed communication %.1f ms, data wait %.1f ms\n",
          meter.compute_ms(), meter.comm_ms(), meter.data_ms());
  }
  const std::vector<dist::MemoryReport> memory = memory_of(r, step_memory);
  if (r.pipe) {
    // Every stage's time split and the bubble, against the formula.
    const std::vector<dist::StageStats> st = r.pipe->gather_stats();
    double bubble = 0;
    for (size_t k = 0; k < st.size(); ++k) {
      const double n = std::max(1, st[k].steps);
      bubble += st[k].bubble() / static_cast<double>(st.size());
      char gather[64] = "";
      if (st[k].gather_s > 0) {
        std::snprintf(gather, sizeof gather, ", parameter gather wait %.1f ms",
                      1e3 * st[k].gather_s / n);
      }
      r.say(
          "train: rank %zu (stage %d): compute %.1f ms, idle %.1f ms, gradient reduction wait "
          "%.1f ms%s per mini-batch; activations at most %.1f MB (%d micro-batches)\n",
          k, static_cast<int>(k) % c.pipeline_stages, 1e3 * st[k].compute_s / n,
          1e3 * st[k].idle_s / n, 1e3 * st[k].reduce_s / n, gather, st[k].peak_activations / 1e6,
          st[k].peak_in_flight);
    }
    r.say("train: pipeline bubble %.1f%% measured, %.1f%% by the formula (S-1)/(M+S-1)\n",
          100 * bubble, 100 * dist::bubble_formula(c.pipeline_stages, c.micro_batches));
    summary_extra["pipeline_bubble"] = bubble;
    summary_extra["pipeline_bubble_formula"] =
        dist::bubble_formula(c.pipeline_stages, c.micro_batches);
  }
  if (r.dp || r.pipe) r.say("%s", dist::memory_table(memory).c_str());
  if (r.dp) {
    const dist::Traffic& t = meter.traffic();
    r.say(
        "train: sent per step by rank 0: allreduce %.1f MB, reduce-scatter %.1f MB, allgather "
        "%.1f MB (between hosts %.1f MB)\n",
        t.allreduce / 1e6, t.reduce_scatter / 1e6, t.allgather / 1e6, t.across_hosts / 1e6);
  }
  nlohmann::json summary = {{"steps", ran},
                            {"seconds", s.seconds},
                            {"images_per_s", s.images_per_s},
                            {"final_loss", s.final_loss},
                            {"compute_ms", meter.compute_ms()},
                            {"comm_wait_ms", meter.comm_ms()},
                            {"data_wait_ms", meter.data_ms()},
                            {"peak_rss_bytes", peak_rss_bytes()},
                            {"skipped_samples", ps.skipped},
                            {"skipped_steps", s.skipped_steps},
                            {"loss_scale", scaler.scale()}};
  summary.update(summary_extra);
  if (!c.baseline_json.empty() && r.lead) {
    summary["scaling_efficiency"] = scaling_efficiency(r, s.images_per_s);
  }
  log["steps"] = std::move(meter.steps_json());
  log["summary"] = summary;
  log["memory"] = memory_json(memory);
  log["shard"] = dist::shard_name(c.shard);
  if (!r.restart.is_null()) log["restart"] = r.restart;

  // What the run leaves: the final checkpoint, the weights, the log.
  write_checkpoint(r, position_after(r, step, epoch, in_epoch));
  if (!c.save.empty() && r.dp) r.dp->gather_parameters();  // every rank: it is collective
  if (!c.save.empty() && r.pipe) r.pipe->gather_model();
  if (!c.save.empty() && r.lead) {
    std::filesystem::create_directories(c.save);
    const std::string path = c.save + "/model.safetensors";
    nn::save_weights(*r.model, path,
                     {{"classes", std::to_string(r.classes)},
                      {"in_channels", std::to_string(r.in_channels)},
                      {"steps", std::to_string(step)}});
    r.say("train: weights saved to %s\n", path.c_str());
  }
  if (!c.json.empty() && r.lead) {
    std::string text = log.dump(1) + "\n";
    nn::write_file_atomically(c.json, {{text.data(), text.size()}});
  }
  if (!c.report.empty() && r.lead) {
    // The page of this run (cohort report); without --json the log goes beside it, so that the
    // page can be drawn again, or with other runs.
    std::string source = c.json;
    if (source.empty()) {
      std::filesystem::create_directories(c.report);
      source = (std::filesystem::path(c.report) / "train.json").string();
      std::string text = log.dump(1) + "\n";
      nn::write_file_atomically(source, {{text.data(), text.size()}});
    }
    const ReportFiles f = write_report({parse_run_log(log, source)}, c.report);
    r.say("train: report in %s (%zu plots%s)\n", f.page.c_str(), f.svgs.size(),
          f.pngs.empty() ? ", SVG only: built without librsvg" : ", with PNG copies");
  }
  if (r.world) r.world->barrier().wait();
  return s;
}

}  // namespace cohort::train
