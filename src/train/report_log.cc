// Reading the logs `cohort report` draws: `cohort train --json` (config, steps, epochs, summary,
// memory) and `cohort bench train --json` (ms_each, the split, memory). Every field is looked up
// by its path, so that a missing or mistyped one is an error naming the file and the field.
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/train/report.h"

// A log that is wrong is the user's to fix: the error says where, without the check's text.
#define REPORT_LOG_CHECK(cond, ...)         \
  do {                                      \
    if (!(cond)) COHORT_THROW(__VA_ARGS__); \
  } while (0)

namespace cohort::train {

namespace {

using nlohmann::json;

// Bounds of the counts a log holds: ranks (and a batch per rank), and samples or epochs.
constexpr double kMostRanks = 1 << 24, kMostSamples = 9007199254740992.0;  // 2^53

const char* type_of(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    default:
      return "something else";
  }
}

// A field of an object, looked up by name; `where` is the object's path ("" at the top).
class Fields {
 public:
  Fields(const std::string& source, std::string kind) : source_(source), kind_(std::move(kind)) {}

  std::string path(const std::string& where, const std::string& key) const {
    return where.empty() ? key : where + "." + key;
  }
  const json& get(const json& obj, const std::string& where, const std::string& key) const {
    REPORT_LOG_CHECK(obj.is_object(), source_ << ": field '" << (where.empty() ? "(top)" : where)
                                              << "' is " << type_of(obj) << ", expected an object");
    auto it = obj.find(key);
    REPORT_LOG_CHECK(it != obj.end(), source_ << ": field '" << path(where, key)
                                              << "' is missing (a " << kind_
                                              << " --json log has it)");
    return *it;
  }
  // A number; null is NaN where `nullable` (the logs write a figure that is undefined as null).
  double number(const json& obj, const std::string& where, const std::string& key,
                bool nullable = false) const {
    const json& v = get(obj, where, key);
    if (v.is_null() && nullable) return NAN;
    REPORT_LOG_CHECK(v.is_number(), source_ << ": field '" << path(where, key) << "' is "
                                            << type_of(v) << " (" << v.dump().substr(0, 40)
                                            << "), expected a number");
    return v.get<double>();
  }
  // A whole number in [lo, hi] (the logs write counts as numbers; a cast of anything else would
  // be undefined).
  int64_t integer(const json& obj, const std::string& where, const std::string& key, double lo,
                  double hi) const {
    const double v = number(obj, where, key);
    REPORT_LOG_CHECK(std::isfinite(v) && v == std::floor(v) && v >= lo && v <= hi,
                     source_ << ": field '" << path(where, key) << "' is " << v
                             << ", expected a whole number in [" << lo << ", " << hi << "]");
    return static_cast<int64_t>(v);
  }
  std::string text(const json& obj, const std::string& where, const std::string& key) const {
    const json& v = get(obj, where, key);
    REPORT_LOG_CHECK(v.is_string(), source_ << ": field '" << path(where, key) << "' is "
                                            << type_of(v) << ", expected a string");
    return v.get<std::string>();
  }
  const json& array(const json& obj, const std::string& where, const std::string& key) const {
    const json& v = get(obj, where, key);
    REPORT_LOG_CHECK(v.is_array(), source_ << ": field '" << path(where, key) << "' is "
                                           << type_of(v) << ", expected an array");
    return v;
  }

 private:
  const std::string& source_;
  std::string kind_;
};

std::string at(const std::string& field, size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

void read_memory(RunLog& r, const Fields& f, const json& log) {
  const json& mem = f.array(log, "", "memory");
  for (size_t i = 0; i < mem.size(); ++i) {
    std::map<std::string, double> rank;
    for (const auto& [key, label] : memory_categories())
      rank[key] = f.number(mem[i], at("memory", i), key);
    rank["peak_rss"] = f.number(mem[i], at("memory", i), "peak_rss");
    r.memory.push_back(std::move(rank));
  }
}

void read_train_log(RunLog& r, const json& log) {
  const Fields f(r.source, "cohort train");
  r.kind = "cohort train";
  const json& config = f.get(log, "", "config");
  r.model = f.text(config, "config", "model");
  r.precision = config.contains("precision") ? f.text(config, "config", "precision") : "f32";
  r.shard = f.text(log, "", "shard");
  if (config.contains("pipeline-stages") && f.text(config, "config", "pipeline-stages") != "0")
    r.shard = "pipeline " + f.text(config, "config", "pipeline-stages") + " stages, " + r.shard;
  r.world = static_cast<int>(f.integer(log, "", "world", 1, kMostRanks));
  r.global_batch = f.integer(log, "", "global_batch", 0, kMostSamples);
  const json& steps = f.array(log, "", "steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string w = at("steps", i);
    r.step.push_back(f.number(steps[i], w, "step"));
    r.loss.push_back(f.number(steps[i], w, "loss", true));
    r.lr.push_back(f.number(steps[i], w, "lr", true));
    r.step_images_per_s.push_back(f.number(steps[i], w, "images_per_s", true));
  }
  const json& epochs = f.array(log, "", "epochs");
  for (size_t i = 0; i < epochs.size(); ++i) {
    const std::string w = at("epochs", i);
    RunLog::Epoch e;
    e.epoch = f.integer(epochs[i], w, "epoch", 0, kMostSamples);
    e.validated = epochs[i].is_object() && epochs[i].contains("val_loss");
    if (e.validated) {
      e.val_loss = f.number(epochs[i], w, "val_loss", true);
      e.val_accuracy = f.number(epochs[i], w, "val_accuracy", true);
      e.val_auc = f.number(epochs[i], w, "val_auc", true);
      if (epochs[i].contains("val_auc_per_finding")) {
        const json& per = f.get(epochs[i], w, "val_auc_per_finding");
        REPORT_LOG_CHECK(per.is_object(), r.source << ": field '" << w
                                                   << ".val_auc_per_finding' is " << type_of(per)
                                                   << ", expected an object");
        for (const auto& [name, v] : per.items()) {
          e.auc_per_finding.emplace_back(name,
                                         f.number(per, w + ".val_auc_per_finding", name, true));
        }
      }
    }
    r.epochs.push_back(std::move(e));
  }
  const json& summary = f.get(log, "", "summary");
  r.images_per_s = f.number(summary, "summary", "images_per_s", true);
  r.has_breakdown = true;
  r.compute_ms = f.number(summary, "summary", "compute_ms");
  r.comm_wait_ms = f.number(summary, "summary", "comm_wait_ms");
  r.data_wait_ms = f.number(summary, "summary", "data_wait_ms");
  read_memory(r, f, log);
}

void read_bench_log(RunLog& r, const json& log) {
  const Fields f(r.source, "cohort bench train");
  r.kind = "cohort bench train";
  r.model = f.text(log, "", "model");
  r.precision = f.text(log, "", "precision");
  r.world = static_cast<int>(f.integer(log, "", "world", 1, kMostRanks));
  const int64_t batch = f.integer(log, "", "batch", 1, kMostRanks);
  r.images_per_s = f.number(log, "", "images_per_s", true);
  const double ms_per_step = f.number(log, "", "ms_per_step");
  if (log.contains("pipeline")) {
    const json& p = f.get(log, "", "pipeline");
    r.shard =
        "pipeline " + std::to_string(f.integer(p, "pipeline", "stages", 1, kMostRanks)) + " stages";
    r.global_batch = batch * f.integer(p, "pipeline", "replicas", 1, kMostRanks);
    r.breakdown_note = "a pipeline bench log has each stage's figures, not this split";
  } else {
    r.shard = f.text(log, "", "shard");
    r.global_batch = batch * r.world;
    r.has_breakdown = true;
    r.comm_wait_ms = f.number(log, "", "ms_comm_wait");
    r.compute_ms = std::max(0.0, ms_per_step - r.comm_wait_ms);
    r.data_wait_ms = 0;
    r.breakdown_note = "synthetic data (bench train), so no data wait";
  }
  const json& ms = f.array(log, "", "ms_each");
  for (size_t i = 0; i < ms.size(); ++i) {
    REPORT_LOG_CHECK(ms[i].is_number(), r.source << ": field '" << at("ms_each", i) << "' is "
                                                 << type_of(ms[i]) << ", expected a number");
    const double v = ms[i].get<double>();
    r.step.push_back(static_cast<double>(i + 1));
    r.step_images_per_s.push_back(v > 0 ? 1e3 * static_cast<double>(r.global_batch) / v : NAN);
  }
  read_memory(r, f, log);
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& memory_categories() {
  static const std::vector<std::pair<std::string, std::string>> c{
      {"parameters", "parameters"},
      {"gradients", "gradients"},
      {"optimizer_state", "optimizer state"},
      {"gathered_peak", "gathered parameters"},
      {"gradients_in_flight_peak", "gradients in flight"},
      {"activations_peak", "activations"},
      {"comm_buffers_peak", "comm buffers"},
      {"allocator_cache_peak", "allocator cache"}};
  return c;
}

RunLog parse_run_log(const nlohmann::json& log, const std::string& source) {
  RunLog r;
  r.source = source;
  r.name = std::filesystem::path(source).stem().string();
  if (r.name.empty()) r.name = source;
  REPORT_LOG_CHECK(log.is_object(),
                   source << ": the log is " << type_of(log) << ", expected an object");
  if (log.contains("config")) {
    read_train_log(r, log);
  } else if (log.contains("ms_each")) {
    read_bench_log(r, log);
  } else {
    COHORT_THROW(source << ": not a cohort train or cohort bench train --json log (it has neither "
                        << "field 'config' nor field 'ms_each')");
  }
  return r;
}

RunLog read_run_log(const std::string& path) {
  std::ifstream in(path);
  REPORT_LOG_CHECK(in, "cannot read the log " << path << ": " << errno_string(errno));
  std::stringstream text;
  text << in.rdbuf();
  json log;
  try {
    log = json::parse(text.str());
  } catch (const json::exception& e) {
    COHORT_THROW(path << " is not valid JSON: " << e.what());
  }
  return parse_run_log(log, path);
}

}  // namespace cohort::train

#undef REPORT_LOG_CHECK
