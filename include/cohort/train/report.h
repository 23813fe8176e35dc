// `cohort report`: the picture of one or more training runs. A run is the JSON log that
// `cohort train --json` or `cohort bench train --json` wrote; the report is one self-contained
// HTML page (inline SVG plots, no scripts, fonts or style sheets from elsewhere) with a PNG copy
// of every plot: loss and learning rate per step, validation accuracy and ROC AUC per finding
// per epoch, images/s, the step breakdown, memory per rank by category, and the scaling
// efficiency between the runs.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cohort::train {

// What the report takes from one log. NaN marks a figure the log holds as null.
struct RunLog {
  std::string name;    // the legend's label (the file's stem, or its path when stems repeat)
  std::string source;  // the file, or what the log came from
  std::string kind;    // "cohort train" or "cohort bench train"
  std::string model, shard, precision;
  int world = 1;
  int64_t global_batch = 0;
  double images_per_s = 0;  // all ranks
  // Per step: train logs have loss and learning rate; both kinds have images/s.
  std::vector<double> step, loss, lr, step_images_per_s;
  struct Epoch {
    int64_t epoch = 0;
    bool validated = false;
    double val_loss = 0, val_accuracy = 0, val_auc = 0;
    std::vector<std::pair<std::string, double>> auc_per_finding;  // multi-label findings
  };
  std::vector<Epoch> epochs;
  // The step breakdown, milliseconds per step (bench train: data wait is 0, synthetic data).
  bool has_breakdown = false;
  double compute_ms = 0, comm_wait_ms = 0, data_wait_ms = 0;
  std::string breakdown_note;  // what the figures are, where it matters
  // Memory per rank: bytes by category (memory_categories() names them), then peak RSS.
  std::vector<std::map<std::string, double>> memory;
};

// The memory categories of a log's "memory" entries, in the order they are stacked.
const std::vector<std::pair<std::string, std::string>>& memory_categories();  // key, label

// Parses a log already in memory; `source` names it in errors ("FILE: field 'x' is missing").
RunLog parse_run_log(const nlohmann::json& log, const std::string& source);
// Reads and parses a log file; a missing file, bad JSON or a missing or mistyped field is an
// error naming the file and the field.
RunLog read_run_log(const std::string& path);

struct ReportFiles {
  std::string page;               // DIR/index.html
  std::vector<std::string> svgs;  // inline in the page too
  std::vector<std::string> pngs;  // empty when built without librsvg
  std::string png_note;           // why there are no PNGs, when there are none
};

// Writes DIR/index.html and DIR/<plot>.png (DIR/<plot>.svg as well), creating DIR. `png`
// false leaves the PNGs out (the fuzz target, which tests the reading and drawing, not librsvg).
ReportFiles write_report(std::vector<RunLog> runs, const std::string& dir, bool png = true);

// Whether this build renders PNGs (librsvg was found when it was configured).
bool report_renders_png();

}  // namespace cohort::train
