// The progress meter of a training run: each step's loss and times go in; out come a progress
// line every --log-every steps (loss, lr, images/s, compute, exposed communication and data
// wait, ETA), the JSON record of every step, and the per-step means of the summary.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "cohort/core/clock.h"
#include "run.h"

namespace cohort::train {

struct StepRecord {
  int64_t step = 0;  // steps done, this one included
  int64_t epoch = 0;
  float loss = 0, lr = 0;
  double compute_s = 0, comm_s = 0, data_s = 0;
  uint64_t images = 0;  // all ranks
  dist::Traffic sent;   // bytes this rank sent, by collective
};

class ProgressMeter {
 public:
  explicit ProgressMeter(const Run& r);
  void record(const StepRecord& s);

  nlohmann::json& steps_json() { return steps_; }
  double seconds() const { return seconds_since(t_run_); }
  uint64_t images() const { return images_; }
  // Per-step means over the steps recorded (0 when none).
  double compute_ms() const { return mean(sum_compute_); }
  double comm_ms() const { return mean(sum_comm_); }
  double data_ms() const { return mean(sum_data_); }
  const dist::Traffic& traffic() const { return last_sent_; }  // the last step's

 private:
  double mean(double sum) const { return n_ ? 1e3 * sum / static_cast<double>(n_) : 0.0; }
  void print_window(const StepRecord& s);

  const Run& r_;
  Clock::time_point t_run_, t_window_;
  nlohmann::json steps_ = nlohmann::json::array();
  int64_t n_ = 0;
  uint64_t images_ = 0;
  double sum_compute_ = 0, sum_comm_ = 0, sum_data_ = 0;
  dist::Traffic last_sent_;
  struct Window {
    double loss = 0, data = 0, compute = 0, comm = 0;
    int n = 0;
    uint64_t images = 0;
  } w_;
};

}  // namespace cohort::train
