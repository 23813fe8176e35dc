// The progress meter (see progress.h).
#include "progress.h"

#include <cmath>
#include <cstdio>

namespace cohort::train {

namespace {
std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}
}  // namespace

ProgressMeter::ProgressMeter(const Run& r) : r_(r), t_run_(Clock::now()), t_window_(t_run_) {}

void ProgressMeter::record(const StepRecord& s) {
  ++n_;
  images_ += s.images;
  sum_compute_ += s.compute_s;
  sum_comm_ += s.comm_s;
  sum_data_ += s.data_s;
  w_.loss += s.loss;
  w_.data += s.data_s;
  w_.compute += s.compute_s;
  w_.comm += s.comm_s;
  w_.images += s.images;
  ++w_.n;
  last_sent_ = s.sent;
  const double step_s = s.compute_s + s.comm_s + s.data_s;
  steps_.push_back({{"step", s.step},
                    {"epoch", s.epoch},
                    {"loss", s.loss},
                    {"lr", s.lr},
                    {"compute_s", s.compute_s},
                    {"comm_wait_s", s.comm_s},
                    {"data_wait_s", s.data_s},
                    {"images_per_s", static_cast<double>(s.images) / step_s},
                    {"sent_bytes",
                     {{"allreduce", s.sent.allreduce},
                      {"reduce_scatter", s.sent.reduce_scatter},
                      {"allgather", s.sent.allgather},
                      {"across_hosts", s.sent.across_hosts}}}});
  if (s.step % r_.c.log_every == 0 || s.step == r_.total) print_window(s);
}

void ProgressMeter::print_window(const StepRecord& s) {
  const double secs = seconds_since(t_window_);
  const double eta = static_cast<double>(r_.total - s.step) * (seconds() / static_cast<double>(n_));
  r_.say(
      "epoch %lld/%d step %lld/%lld loss %.4f lr %.4g images/s %.1f compute %.0f ms "
      "comm wait %.0f ms data wait %.0f ms ETA %s\n",
      static_cast<long long>(s.epoch + 1), r_.c.epochs, static_cast<long long>(s.step),
      static_cast<long long>(r_.total), w_.loss / w_.n, s.lr, static_cast<double>(w_.images) / secs,
      1e3 * w_.compute / w_.n, 1e3 * w_.comm / w_.n, 1e3 * w_.data / w_.n, hms(eta).c_str());
  w_ = Window{};
  t_window_ = Clock::now();
}

}  // namespace cohort::train
