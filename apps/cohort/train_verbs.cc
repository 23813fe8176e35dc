// `cohort train` and `cohort bench train`.
#include <map>
#include <memory>

#include "cohort/nn/model.h"
#include "cohort/plan/plan.h"
#include "cohort/train/trainer.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

void add_pipeline_options(CLI::App& app, dist::PipelineOptions& p) {
  app.add_option("--pipeline-stages", p.stages,
                 "Cut the model into this many pipeline stages (ranks: stages x replicas)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--micro-batches", p.micro_batches, "Pipeline micro-batches per mini-batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--pipeline-schedule", p.schedule, "Pipeline schedule: gpipe or 1f1b")
      ->transform(CLI::CheckedTransformer(std::map<std::string, dist::Schedule>{
          {"gpipe", dist::Schedule::gpipe}, {"1f1b", dist::Schedule::one_f_one_b}}))
      ->default_str("1f1b");
  app.add_option("--pipeline-cuts", p.cuts,
                 "The first piece of stages 1.. (S-1 numbers); default: balanced")
      ->delimiter(',');
  app.add_option("--pipeline-balance", p.balance,
                 "Balance the cut by flops (counted) or time (measured on rank 0)")
      ->capture_default_str()
      ->check(CLI::IsMember({"flops", "time"}));
  app.add_flag("--deferred-batch-norm", p.deferred_batch_norm,
               "BatchNorm running statistics over the whole mini-batch, not per micro-batch");
  app.add_flag("--recompute", p.recompute,
               "Keep only each micro-batch's stage input; run its forward again in backward");
}

}  // namespace

Run add_train(CLI::App& app) {
  struct Opts {
    std::string config;
    std::map<std::string, std::string> values;
    std::map<std::string, bool> flags;
    std::map<std::string, CLI::Option*> given;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--config", o->config,
                 "JSON (.json) or TOML file with the same keys as the flags; flags override it");
  train::TrainConfig defaults;
  for (const train::ConfigKey& k : train::train_config_keys()) {
    CLI::Option* opt = nullptr;
    if (k.is_flag) {
      opt = app.add_flag("--" + k.name, o->flags[k.name], k.help);
    } else {
      opt = app.add_option("--" + k.name, o->values[k.name], k.help);
      const std::string d = k.get(defaults);
      if (!d.empty()) opt->default_str(d);
    }
    o->given[k.name] = opt;
  }
  return [o]() -> int {
    train::TrainConfig c;
    if (!o->config.empty()) train::apply_config_file(c, o->config);
    for (auto& [name, opt] : o->given) {
      if (opt->count() == 0) continue;
      const std::string v =
          o->flags.count(name) ? (o->flags[name] ? "true" : "false") : o->values[name];
      train::set_config_key(c, name, v, "--" + name);
    }
    train::run_training(c);
    return 0;
  };
}

Run add_bench_train(CLI::App& app) {
  auto o = std::make_shared<train::BenchTrainOptions>();
  std::string models;
  for (auto& n : nn::model_names()) models += (models.empty() ? "" : ", ") + n;
  app.add_option("--model", o->model, "Model: " + models)->capture_default_str();
  app.add_option("--batch", o->batch, "Samples per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--image-size", o->image_size, "Height and width")
      ->capture_default_str()
      ->check(CLI::Range(8, 16384));
  app.add_option("--in-channels", o->in_channels, "Input channels")
      ->capture_default_str()
      ->check(CLI::Range(1, 4));
  app.add_option("--num-classes", o->num_classes, "Classes")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--steps", o->steps, "Timed steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--threads", o->threads, "Compute threads (0: all this rank may use)")
      ->capture_default_str();
  app.add_option("--optimizer", o->optimizer, "sgd, adamw or lars")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adamw", "lars"}));
  app.add_option("--json", o->json, "Write the figures as JSON");
  app.add_option("--precision", o->precision, "Convolution and Linear compute: f32, bf16, f16")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, train::Precision>{{"f32", train::Precision::f32},
                                                  {"bf16", train::Precision::bf16},
                                                  {"f16", train::Precision::f16}}))
      ->default_str("f32");
  app.add_option("--device", o->device, "cpu, or cuda: each rank on the GPU of its local rank")
      ->transform(CLI::CheckedTransformer(std::map<std::string, tensor::Device>{
          {"cpu", tensor::Device::cpu}, {"cuda", tensor::Device::cuda}}))
      ->default_str("cpu");
  app.add_flag("!--no-profile", o->profile, "Skip the per-op time split");
  app.add_flag("--no-sync", o->no_sync,
               "Under DDP, communicate nothing (as PyTorch's no_sync): the step without its "
               "allreduces");
  app.add_option("--bucket-mb", o->ddp.bucket_mb, "DDP bucket size in MiB")->capture_default_str();
  app.add_option("--first-bucket-mb", o->ddp.first_bucket_mb, "DDP first bucket in MiB")
      ->capture_default_str();
  app.add_option("--reduce-dtype", o->ddp.compression, "Gradients reduced in f32, bf16 or f16")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, dist::Compression>{{"f32", dist::Compression::none},
                                                   {"bf16", dist::Compression::bf16},
                                                   {"f16", dist::Compression::f16}}))
      ->default_str("f32");
  app.add_option("--shard", o->ddp.shard, "none (DDP), zero1, zero2, zero3 or hybrid")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, dist::Shard>{{"none", dist::Shard::none},
                                             {"zero1", dist::Shard::zero1},
                                             {"zero2", dist::Shard::zero2},
                                             {"zero3", dist::Shard::zero3},
                                             {"hybrid", dist::Shard::hybrid}}))
      ->default_str("none");
  app.add_option("--reshard-after-forward", o->ddp.reshard_after_forward,
                 "zero3/hybrid: free a unit's parameters after its forward")
      ->capture_default_str();
  app.add_option("--max-prefetch", o->ddp.max_prefetch, "zero3/hybrid: unit gathers ahead")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option_function<std::string>(
      "--max-memory",
      [o](const std::string& v) { o->max_memory = train::parse_byte_size("--max-memory", v); },
      "Per-rank memory cap (K/M/G suffixes)");
  add_pipeline_options(app, o->pipeline);
  auto profile_path = std::make_shared<std::string>();
  app.add_option("--profile", *profile_path,
                 "Write the model's profile for cohort plan here (JSON): per layer FLOPs, "
                 "parameters, activations and the time measured in this run");
  return [o, profile_path]() -> int {
    // Checked before the run: a model with no built-in profile fails at once.
    std::unique_ptr<plan::ModelProfile> profile;
    if (!profile_path->empty()) {
      profile = std::make_unique<plan::ModelProfile>(
          plan::builtin_profile(o->model, o->image_size, o->in_channels, o->num_classes));
      o->timeline = true;
    }
    const train::BenchTrainResult r = train::bench_train(*o);
    if (profile && r.lead) {
      std::vector<plan::MeasuredOp> ops;
      for (const nn::timeline::OpTime& t : r.ops) ops.push_back({t.kind, t.forward, t.backward});
      plan::attach_measurements(*profile, ops, r.timed_steps, o->batch);
      profile->source +=
          " (" + std::to_string(r.threads) + " threads, batch " + std::to_string(o->batch) + ")";
      plan::write_profile(*profile, *profile_path);
      std::printf("profile: %s (%zu layers, measured over %d steps)\n", profile_path->c_str(),
                  profile->layers.size(), r.timed_steps);
    }
    return 0;
  };
}

}  // namespace cohort::cli
