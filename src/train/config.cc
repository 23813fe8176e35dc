#include "cohort/train/config.h"

#include <toml++/toml.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/core/error.h"

namespace cohort::train {

namespace {

template <class T>
T parse_number(const std::string& key, const std::string& text) {
  std::istringstream in(text);
  T v{};
  in >> v;
  COHORT_CHECK(!in.fail() && in.eof(), "'" << key << "' wants a number, got '" << text << "'");
  return v;
}

}  // namespace

uint64_t parse_byte_size(const std::string& key, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    COHORT_THROW("'" << key << "' wants a size in bytes (e.g. 8G), got '" << text << "'");
  }
  const std::string unit = text.substr(used);
  double k = 1;
  if (unit == "K" || unit == "KiB")
    k = 1024.0;
  else if (unit == "M" || unit == "MiB")
    k = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    k = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB")
    k = 1024.0 * 1024 * 1024 * 1024;
  else
    COHORT_CHECK(unit.empty(), "'" << key << "': unknown unit '" << unit << "' in '" << text
                                   << "' (K, M, G or T)");
  COHORT_CHECK(v >= 0, "'" << key << "' must not be negative, got '" << text << "'");
  // 2^64 and beyond (or inf) has no uint64_t: the cast would be undefined.
  COHORT_CHECK(v * k < 18446744073709551616.0,
               "'" << key << "' is beyond 2^64 bytes, got '" << text << "'");
  return static_cast<uint64_t>(v * k);
}

namespace {

bool parse_bool(const std::string& key, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  COHORT_THROW("'" << key << "' wants true or false, got '" << text << "'");
}

template <class T>
ConfigKey num(const char* name, const char* help, T TrainConfig::*field, T lo, T hi) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.set = [=](TrainConfig& c, const std::string& v) {
    const T x = parse_number<T>(name, v);
    COHORT_CHECK(x >= lo && x <= hi,
                 "'" << name << "' must be in [" << lo << ", " << hi << "], got " << v);
    c.*field = x;
  };
  k.get = [=](const TrainConfig& c) {
    std::ostringstream o;
    o << c.*field;
    return o.str();
  };
  return k;
}

ConfigKey str(const char* name, const char* help, std::string TrainConfig::*field,
              std::vector<std::string> choices = {}) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.set = [=](TrainConfig& c, const std::string& v) {
    if (!choices.empty()) {
      bool ok = false;
      std::string list;
      for (auto& ch : choices) {
        ok |= ch == v;
        list += (list.empty() ? "" : ", ") + ch;
      }
      COHORT_CHECK(ok, "'" << name << "' must be one of " << list << ", got '" << v << "'");
    }
    c.*field = v;
  };
  k.get = [=](const TrainConfig& c) { return c.*field; };
  return k;
}

// A key whose value is one of an enum's names.
template <class E>
ConfigKey choice(const char* name, const char* help, E TrainConfig::*field, std::vector<E> values,
                 const char* (*name_of)(E)) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.set = [=](TrainConfig& c, const std::string& v) {
    std::string list;
    for (E e : values) {
      if (v == name_of(e)) {
        c.*field = e;
        return;
      }
      list += (list.empty() ? "" : ", ") + std::string(name_of(e));
    }
    COHORT_THROW("'" << name << "' must be one of " << list << ", got '" << v << "'");
  };
  k.get = [=](const TrainConfig& c) { return std::string(name_of(c.*field)); };
  return k;
}

// A boolean that takes its value: --key true|false.
ConfigKey boolean(const char* name, const char* help, bool TrainConfig::*field) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.set = [=](TrainConfig& c, const std::string& v) { c.*field = parse_bool(name, v); };
  k.get = [=](const TrainConfig& c) { return std::string(c.*field ? "true" : "false"); };
  return k;
}

// A size in bytes: a number with an optional K, M, G or T (powers of 1024).
ConfigKey byte_size(const char* name, const char* help, uint64_t TrainConfig::*field) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.set = [=](TrainConfig& c, const std::string& v) { c.*field = parse_byte_size(name, v); };
  k.get = [=](const TrainConfig& c) { return std::to_string(c.*field); };
  return k;
}

ConfigKey flag(const char* name, const char* help, bool TrainConfig::*field) {
  ConfigKey k;
  k.name = name;
  k.help = help;
  k.is_flag = true;
  k.set = [=](TrainConfig& c, const std::string& v) { c.*field = parse_bool(name, v); };
  k.get = [=](const TrainConfig& c) { return std::string(c.*field ? "true" : "false"); };
  return k;
}

std::string normalise(std::string key) {
  for (char& ch : key)
    if (ch == '_') ch = '-';
  return key;
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::bf16:
      return "bf16";
    case Precision::f16:
      return "f16";
  }
  return "invalid";
}

const char* lr_scaling_name(LrScaling s) {
  return s == LrScaling::linear ? "linear" : "none";
}

const std::vector<ConfigKey>& train_config_keys() {
  using C = TrainConfig;
  static const std::vector<ConfigKey> keys{
      str("model", "Model name (resnet18..152, densenet121, smallcnn)", &C::model),
      str("data", "Training data: ImageFolder, CSV list or shard folder", &C::data),
      str("val", "Validation data (same kinds)", &C::val),
      str("save", "Folder for the final weights (model.safetensors)", &C::save),
      str("json", "Write the JSON log of every figure here", &C::json),
      num("epochs", "Epochs", &C::epochs, 1, 1000000),
      num("batch", "Samples per batch (per rank)", &C::batch, 1, 65536),
      num("lr", "Learning rate (before any scaling rule)", &C::lr, 0.0f, 1e6f),
      str("optimizer", "sgd, adamw or lars", &C::optimizer, {"sgd", "adamw", "lars"}),
      num("momentum", "SGD/LARS momentum", &C::momentum, 0.0f, 1.0f),
      num("weight-decay", "Weight decay", &C::weight_decay, 0.0f, 1.0f),
      flag("nesterov", "Nesterov momentum", &C::nesterov),
      str("schedule", "cosine, step or constant (after warmup)", &C::schedule,
          {"cosine", "step", "constant"}),
      num("warmup-epochs", "Linear warmup length in epochs", &C::warmup_epochs, 0.0f, 1e6f),
      num("step-epochs", "step schedule: x0.1 every this many epochs", &C::step_epochs, 1, 1000000),
      choice("lr-scaling", "none, or linear: lr x global batch / reference batch", &C::lr_scaling,
             {LrScaling::none, LrScaling::linear}, lr_scaling_name),
      num("lr-reference-batch", "Reference batch of the linear scaling rule",
          &C::lr_reference_batch, 1, 1 << 30),
      num("label-smoothing", "Cross-entropy label smoothing", &C::label_smoothing, 0.0f, 0.99f),
      num("image-size", "Input height and width in pixels", &C::image_size, 8, 16384),
      num("crop-scale", "Smallest area fraction of the random-resized crop", &C::crop_scale, 0.01f,
          1.0f),
      num("crop-ratio-min", "Smallest aspect ratio (w/h) of the random-resized crop",
          &C::crop_ratio_min, 0.1f, 10.0f),
      num("crop-ratio-max", "Largest aspect ratio (w/h) of the random-resized crop",
          &C::crop_ratio_max, 0.1f, 10.0f),
      flag("hflip", "Random horizontal flips (off by default: anatomy is not mirror-symmetric)",
           &C::hflip),
      flag("vflip", "Random vertical flips", &C::vflip),
      num("rotation", "Random rotation within +- this many degrees (0: off)", &C::rotation, 0.0f,
          180.0f),
      num("brightness", "Brightness jitter amplitude, fraction of full scale (0: off)",
          &C::brightness, 0.0f, 1.0f),
      num("contrast", "Contrast jitter amplitude (0: off)", &C::contrast, 0.0f, 1.0f),
      num("window-center", "DICOM window center (with window-width)", &C::window_center, -1e9f,
          1e9f),
      num("window-width", "DICOM window width (0: each file's own window)", &C::window_width, 0.0f,
          1e9f),
      num("in-channels", "Input channels (0: as decoded)", &C::in_channels, 0, 4),
      num("num-classes", "Classes (0: from the labels)", &C::num_classes, 0, 1 << 20),
      flag("multilabel", "Multi-label findings (BCE with logits)", &C::multilabel),
      num("workers", "Data pipeline threads", &C::workers, 1, 256),
      num("threads", "Compute threads (0: this rank's cores)", &C::threads, 0, 1024),
      num("log-every", "Steps between progress lines", &C::log_every, 1, 1 << 30),
      num("max-steps", "Stop after this many steps (0: all epochs)", &C::max_steps, int64_t{0},
          int64_t{1} << 40),
      num("seed", "Seed of weights, sampling and augmentation", &C::seed, uint64_t{0},
          ~uint64_t{0}),
      num("accum-steps", "Micro-batches per optimiser step (only the last communicates)",
          &C::accum_steps, 1, 1 << 20),
      num("bucket-mb", "DDP bucket size in MiB", &C::bucket_mb, 0.01f, 1e5f),
      num("first-bucket-mb", "DDP first bucket size in MiB (starts communication early)",
          &C::first_bucket_mb, 0.01f, 1e5f),
      choice("reduce-dtype", "Gradients reduced in f32, bf16 or f16 (DDP buckets, ZeRO units)",
             &C::reduce_dtype,
             {dist::Compression::none, dist::Compression::bf16, dist::Compression::f16},
             dist::compression_name),
      choice("shard", "none (DDP), zero1, zero2, zero3 (FSDP full sharding) or hybrid", &C::shard,
             {dist::Shard::none, dist::Shard::zero1, dist::Shard::zero2, dist::Shard::zero3,
              dist::Shard::hybrid},
             dist::shard_name),
      boolean("reshard-after-forward",
              "zero3/hybrid: free a unit's parameters after its forward (false: keep them for "
              "backward)",
              &C::reshard_after_forward),
      num("max-prefetch", "zero3/hybrid: unit gathers in flight ahead of use", &C::max_prefetch, 0,
          64),
      flag("accum-local-grads",
           "zero2/3: keep full local gradients over --accum-steps and reduce once (more memory, "
           "less traffic)",
           &C::accum_local_grads),
      byte_size("max-memory", "Per-rank memory cap in bytes (K/M/G suffixes; 0: none)",
                &C::max_memory),
      flag("sync-bn", "SyncBatchNorm: batch statistics over all ranks", &C::sync_bn),
      num("pipeline-stages",
          "Cut the model into this many pipeline stages (0: none; ranks = stages x replicas)",
          &C::pipeline_stages, 0, 1024),
      num("micro-batches", "Pipeline micro-batches per mini-batch (--batch)", &C::micro_batches, 1,
          4096),
      str("pipeline-schedule", "Pipeline schedule: gpipe or 1f1b", &C::pipeline_schedule,
          {"gpipe", "1f1b"}),
      str("pipeline-cuts",
          "The first piece of pipeline stages 1.. (comma-separated; default: "
          "balanced)",
          &C::pipeline_cuts),
      str("pipeline-balance", "Balance the pipeline cut by flops or time (measured on rank 0)",
          &C::pipeline_balance, {"flops", "time"}),
      flag("deferred-batch-norm",
           "Pipeline: BatchNorm running statistics over the whole mini-batch, not per micro-batch",
           &C::deferred_batch_norm),
      flag("recompute",
           "Pipeline: keep each micro-batch's stage input only; forward again in "
           "backward",
           &C::recompute),
      num("clip-grad-norm", "Clip gradients to this global norm (0: off)", &C::clip_grad_norm, 0.0f,
          1e9f),
      num("checkpoint-every", "Write a checkpoint every N steps (0: at the end only)",
          &C::checkpoint_every, int64_t{0}, int64_t{1} << 40),
      str("checkpoint-dir", "Folder for checkpoint.safetensors", &C::checkpoint_dir),
      str("resume", "Continue exactly from the checkpoint in this folder", &C::resume),
      str("baseline-json", "A 1-rank run's --json: report scaling efficiency against it",
          &C::baseline_json),
      str("report", "At the end, write this run's page here (cohort report: plots, HTML, PNG)",
          &C::report),
      choice("precision", "Convolution and Linear compute: f32, bf16 or f16 (f32 master weights)",
             &C::precision, {Precision::f32, Precision::bf16, Precision::f16}, precision_name),
      choice("device", "cpu, or cuda: each rank trains on the GPU of its local rank", &C::device,
             {tensor::Device::cpu, tensor::Device::cuda}, tensor::device_name),
      str("decode", "auto (gpu under --device cuda), cpu or gpu: JPEG and DICOM decoding",
          &C::decode, {"auto", "cpu", "gpu"}),
      str("augment-on", "auto (gpu under --device cuda), cpu or gpu: crop, resize, augmentations",
          &C::augment_on, {"auto", "cpu", "gpu"}),
      num("loss-scale", "f16: initial dynamic loss scale", &C::loss_scale, 1.0f, 1e10f),
      str("resume-policy",
          "A resume off this layout's batches: auto (exact where possible, else repeat), exact, "
          "repeat or skip the samples to the next boundary",
          &C::resume_policy, {"auto", "exact", "repeat", "skip"}),
      str("sample-log",
          "Each rank writes PATH.rank<R>: a line per micro-batch, epoch step data set indices",
          &C::sample_log),
  };
  return keys;
}

void set_config_key(TrainConfig& c, const std::string& key, const std::string& value,
                    const std::string& origin) {
  const std::string k = normalise(key);
  for (const ConfigKey& ck : train_config_keys()) {
    if (ck.name != k) continue;
    try {
      ck.set(c, value);
    } catch (const Error& e) {
      COHORT_THROW(origin << ": " << e.message());
    }
    return;
  }
  COHORT_THROW(origin << ": unknown key '" << key << "' (cohort train --help lists the keys)");
}

void apply_config_file(TrainConfig& c, const std::string& path) {
  std::ifstream in(path);
  if (!in) COHORT_THROW("cannot open config file " << path << ": " << errno_string(errno));
  std::stringstream text;
  text << in.rdbuf();
  const bool is_json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  if (is_json) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text.str());
    } catch (const std::exception& e) {
      COHORT_THROW("config file " << path << " is not valid JSON: " << e.what());
    }
    COHORT_CHECK(j.is_object(), "config file " << path << ": the top level must be an object");
    for (auto& [k, v] : j.items()) {
      COHORT_CHECK(v.is_primitive() && !v.is_null(),
                   path << ": key '" << k << "' must be a string, number or boolean");
      set_config_key(c, k, v.is_string() ? v.get<std::string>() : v.dump(), path);
    }
    return;
  }
  toml::table t;
  try {
    t = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    COHORT_THROW("config file " << path << " is not valid TOML: " << e.description() << " at "
                                << where.str());
  }
  for (auto& [k, node] : t) {
    const std::string key(k.str());
    std::string v;
    if (auto s = node.value<std::string>(); s && node.is_string()) {
      v = *s;
    } else if (node.is_boolean()) {
      v = *node.value<bool>() ? "true" : "false";
    } else if (node.is_integer()) {
      v = std::to_string(*node.value<int64_t>());
    } else if (node.is_floating_point()) {
      std::ostringstream o;
      o << *node.value<double>();
      v = o.str();
    } else {
      COHORT_THROW(path << ": key '" << key << "' must be a string, number or boolean");
    }
    set_config_key(c, key, v, path);
  }
}

}  // namespace cohort::train
