#include "cohort/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/comm/communicator.h"
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/data/pipeline.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/safetensors.h"
#include "cohort/train/metrics.h"

namespace cohort::train {

using nn::Var;
using tensor::Order;

float train_step(nn::Model& m, nn::Optimizer& opt, const Tensor& x, const Targets& t, float lr,
                 float label_smoothing, StepTimes* times) {
  auto t0 = Clock::now();
  m.zero_grad();
  nn::Tape tape;
  float loss_value = 0;
  {
    nn::Tape::Recording rec(tape);
    Var logits = m.forward(nn::constant(x));
    Var loss = t.multilabel.defined() ? nn::bce_with_logits(logits, t.multilabel)
                                      : nn::cross_entropy(logits, t.classes, label_smoothing);
    loss_value = loss->value.data<float>()[0];
    auto t1 = Clock::now();
    tape.backward(loss);
    auto t2 = Clock::now();
    if (times) {
      times->forward += std::chrono::duration<double>(t1 - t0).count();
      times->backward += std::chrono::duration<double>(t2 - t1).count();
    }
  }
  auto t3 = Clock::now();
  {
    nn::profile::Scope prof("optimizer");
    opt.step(lr);
  }
  if (times) times->optimizer += seconds_since(t3);
  return loss_value;
}

namespace {

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}

Tensor batch_tensor(const data::Batch& b) {
  return Tensor::wrap(const_cast<uint8_t*>(b.data), {b.size, b.channels, b.height, b.width},
                      tensor::DType::f32, Order::channels_last);
}

Targets batch_targets(const data::Batch& b, bool multilabel, int classes) {
  Targets t;
  if (!multilabel) {
    t.classes.assign(b.labels.begin(), b.labels.begin() + b.size);
    return t;
  }
  t.multilabel = Tensor::zeros({b.size, classes});
  for (int i = 0; i < b.size; ++i)
    for (int l : b.label_sets[i]) {
      COHORT_CHECK(l >= 0 && l < classes, "finding " << l << " of sample " << b.indices[i]
                                                     << " outside [0, " << classes << ")");
      t.multilabel.data<float>()[i * classes + l] = 1.0f;
    }
  return t;
}

data::PipelineOptions pipeline_options(const TrainConfig& c, bool train, int world, int rank) {
  data::PipelineOptions po;
  po.batch = c.batch;
  po.workers = c.workers;
  po.size = c.image_size;
  po.seed = c.seed;
  po.train = train;
  po.crop_scale_min = c.crop_scale;
  po.resize = c.image_size;  // validation sees the whole (square) scan
  po.layout = data::Layout::nhwc;
  po.out = data::OutType::f32;
  po.channels = c.in_channels == 3 ? 3 : 0;
  po.world = world;
  po.rank = rank;
  po.shuffle = train;
  return po;
}

EvalResult evaluate(nn::Model& m, data::Pipeline& p, bool multilabel, int classes) {
  m.train(false);
  nn::NoGrad ng;
  EvalResult r;
  std::vector<std::vector<float>> scores(multilabel ? classes : 1);
  std::vector<std::vector<int>> labels(scores.size());
  double loss_sum = 0;
  size_t correct = 0;
  p.start_epoch(0);
  data::Batch b;
  while (p.next(&b)) {
    Targets t = batch_targets(b, multilabel, classes);
    Var logits = m.forward(nn::constant(batch_tensor(b)));
    Tensor z = logits->value.contiguous();
    const float* zp = z.data<float>();
    Var loss = multilabel ? nn::bce_with_logits(logits, t.multilabel)
                          : nn::cross_entropy(logits, t.classes);
    loss_sum += static_cast<double>(loss->value.data<float>()[0]) * b.size;
    for (int i = 0; i < b.size; ++i) {
      const float* row = zp + i * classes;
      if (multilabel) {
        for (int k = 0; k < classes; ++k) {
          scores[k].push_back(row[k]);
          labels[k].push_back(t.multilabel.data<float>()[i * classes + k] > 0);
        }
        continue;
      }
      const int arg = static_cast<int>(std::max_element(row, row + classes) - row);
      correct += arg == t.classes[i];
      if (classes == 2) {
        scores[0].push_back(row[1] - row[0]);  // monotone in softmax p(1)
        labels[0].push_back(t.classes[i]);
      }
    }
    r.samples += static_cast<size_t>(b.size);
  }
  m.train(true);
  r.loss = r.samples ? loss_sum / static_cast<double>(r.samples) : 0;
  r.accuracy = r.samples && !multilabel ? static_cast<double>(correct) / r.samples : std::nan("");
  r.auc = std::nan("");
  if (multilabel || classes == 2) {
    double sum = 0;
    int n = 0;
    for (size_t k = 0; k < scores.size(); ++k) {
      const double a = roc_auc(scores[k], labels[k]);
      if (std::isfinite(a)) {
        sum += a;
        ++n;
      }
    }
    if (n) r.auc = sum / n;
  }
  return r;
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nullptr;
}

}  // namespace

TrainSummary run_training(const TrainConfig& c) {
  COHORT_CHECK(!c.data.empty(), "cohort train needs --data (or 'data' in the config file)");
  comm::JobEnv job = comm::detect_job_env();
  COHORT_CHECK(job.world == 1,
               "cohort train runs on one rank until data-parallel training "
               "lands; this job has "
                   << job.world << " ranks");
  if (c.threads > 0) tensor::set_threads(c.threads);

  auto source = data::open_source(c.data);
  COHORT_CHECK(source->size() > 0, "training data " << c.data << " holds no samples");
  int classes = c.num_classes;
  if (classes == 0) {
    int mx = -1;
    for (size_t i = 0; i < source->size(); ++i)
      for (int l : source->labels(i)) mx = std::max(mx, l);
    classes = std::max(mx + 1, 2);
  }
  data::Pipeline train_p(source, pipeline_options(c, true, job.world, job.rank));
  std::unique_ptr<data::Pipeline> val_p;
  if (!c.val.empty()) {
    val_p = std::make_unique<data::Pipeline>(data::open_source(c.val),
                                             pipeline_options(c, false, 1, 0));
  }
  const int in_ch = train_p.channels();
  COHORT_CHECK(c.in_channels == 0 || c.in_channels == in_ch,
               "in-channels " << c.in_channels << " but " << c.data << " decodes to " << in_ch);

  auto model = nn::make_model(c.model, nn::ModelOptions{in_ch, classes, c.image_size, c.seed});
  nn::OptimOptions oo;
  oo.kind = c.optimizer;
  oo.momentum = c.momentum;
  oo.nesterov = c.nesterov;
  oo.weight_decay = c.weight_decay;
  auto opt = nn::make_optimizer(*model, oo);

  const int64_t global_batch = int64_t{c.batch} * job.world;
  const float lr = c.lr_scaling == "linear"
                       ? nn::linear_scaled_lr(c.lr, global_batch, c.lr_reference_batch)
                       : c.lr;
  const int64_t per_epoch = static_cast<int64_t>(train_p.batches_per_epoch());
  int64_t total = per_epoch * c.epochs;
  if (c.max_steps > 0) total = std::min(total, c.max_steps);
  nn::LrSchedule sched;
  sched.lr = lr;
  sched.kind = c.schedule;
  sched.warmup_steps = static_cast<int64_t>(std::llround(c.warmup_epochs * per_epoch));
  sched.total_steps = total;
  sched.step_every = int64_t{c.step_epochs} * per_epoch;

  std::printf(
      "train: %s (%lld parameters, %d input channels, %d %s) on %s: %zu samples, "
      "%lld steps/epoch, batch %d, %d compute threads, %d data workers\n",
      c.model.c_str(), static_cast<long long>(model->num_parameters()), in_ch, classes,
      c.multilabel ? "findings" : "classes", c.data.c_str(), source->size(),
      static_cast<long long>(per_epoch), c.batch, tensor::threads(), c.workers);
  if (c.lr_scaling == "linear") {
    std::printf(
        "train: lr %g x global batch %lld / %d = %g (linear scaling rule), warmup %lld "
        "steps, then %s\n",
        c.lr, static_cast<long long>(global_batch), c.lr_reference_batch, lr,
        static_cast<long long>(sched.warmup_steps), c.schedule.c_str());
  } else {
    std::printf("train: lr %g, warmup %lld steps, then %s\n", lr,
                static_cast<long long>(sched.warmup_steps), c.schedule.c_str());
  }
  std::fflush(stdout);

  nlohmann::json log = nlohmann::json::object();
  nlohmann::json cfg = nlohmann::json::object();
  for (const ConfigKey& k : train_config_keys()) cfg[k.name] = k.get(c);
  log["config"] = cfg;
  log["lr_effective"] = lr;
  log["parameters"] = model->num_parameters();
  log["steps"] = nlohmann::json::array();
  log["epochs"] = nlohmann::json::array();

  TrainSummary s;
  auto t_run = Clock::now();
  int64_t step = 0;
  uint64_t images = 0;
  double window_loss = 0, window_data = 0, window_compute = 0;
  int window_n = 0;
  uint64_t window_images = 0;
  auto t_window = Clock::now();
  for (int epoch = 0; epoch < c.epochs && step < total; ++epoch) {
    train_p.start_epoch(static_cast<uint64_t>(epoch));
    double epoch_loss = 0;
    int64_t epoch_steps = 0;
    data::Batch b;
    while (step < total) {
      auto t0 = Clock::now();
      if (!train_p.next(&b)) break;
      const double data_s = seconds_since(t0);
      auto t1 = Clock::now();
      const float step_lr = sched.at(step);
      const float loss =
          train_step(*model, *opt, batch_tensor(b), batch_targets(b, c.multilabel, classes),
                     step_lr, c.label_smoothing);
      const double compute_s = seconds_since(t1);
      COHORT_CHECK(std::isfinite(loss), "loss is " << loss << " at step " << step << " (lr "
                                                   << step_lr << "): training diverged");
      ++step;
      ++epoch_steps;
      images += static_cast<uint64_t>(b.size);
      epoch_loss += loss;
      window_loss += loss;
      window_data += data_s;
      window_compute += compute_s;
      window_images += static_cast<uint64_t>(b.size);
      ++window_n;
      log["steps"].push_back({{"step", step},
                              {"epoch", epoch},
                              {"loss", loss},
                              {"lr", step_lr},
                              {"compute_s", compute_s},
                              {"data_wait_s", data_s},
                              {"images_per_s", b.size / (compute_s + data_s)}});
      if (step % c.log_every == 0 || step == total) {
        const double secs = seconds_since(t_window);
        const double ips = window_images / secs;
        const double eta = (total - step) * (seconds_since(t_run) / step);
        std::printf(
            "epoch %d/%d step %lld/%lld loss %.4f lr %.4g images/s %.1f compute %.0f ms "
            "data wait %.0f ms ETA %s\n",
            epoch + 1, c.epochs, static_cast<long long>(step), static_cast<long long>(total),
            window_loss / window_n, step_lr, ips, 1e3 * window_compute / window_n,
            1e3 * window_data / window_n, hms(eta).c_str());
        std::fflush(stdout);
        window_loss = window_data = window_compute = 0;
        window_n = 0;
        window_images = 0;
        t_window = Clock::now();
      }
      s.final_loss = loss;
    }
    nlohmann::json ej = {{"epoch", epoch},
                         {"train_loss", epoch_steps ? epoch_loss / epoch_steps : 0.0},
                         {"steps", epoch_steps}};
    if (val_p) {
      EvalResult r = evaluate(*model, *val_p, c.multilabel, classes);
      s.last_val = r;
      s.has_val = true;
      std::printf("epoch %d/%d validation: %zu samples, loss %.4f", epoch + 1, c.epochs, r.samples,
                  r.loss);
      if (std::isfinite(r.accuracy)) std::printf(", accuracy %.4f", r.accuracy);
      if (std::isfinite(r.auc)) std::printf(", ROC AUC %.4f", r.auc);
      std::printf("\n");
      std::fflush(stdout);
      ej["val_loss"] = r.loss;
      ej["val_accuracy"] = finite_or_null(r.accuracy);
      ej["val_auc"] = finite_or_null(r.auc);
    }
    log["epochs"].push_back(ej);
  }
  s.steps = step;
  s.seconds = seconds_since(t_run);
  s.images_per_s = images / s.seconds;
  const data::PipelineStats ps = train_p.stats();
  std::printf(
      "train: %lld steps in %.1f s, %.1f images/s, final loss %.4f, peak RSS %.0f MB, "
      "%llu unreadable samples skipped\n",
      static_cast<long long>(s.steps), s.seconds, s.images_per_s, s.final_loss,
      peak_rss_bytes() / 1e6, static_cast<unsigned long long>(ps.skipped));
  log["summary"] = {{"steps", s.steps},
                    {"seconds", s.seconds},
                    {"images_per_s", s.images_per_s},
                    {"final_loss", s.final_loss},
                    {"peak_rss_bytes", peak_rss_bytes()},
                    {"skipped_samples", ps.skipped}};
  if (!c.save.empty()) {
    std::filesystem::create_directories(c.save);
    const std::string path = c.save + "/model.safetensors";
    nn::save_weights(*model, path,
                     {{"classes", std::to_string(classes)},
                      {"in_channels", std::to_string(in_ch)},
                      {"steps", std::to_string(step)}});
    std::printf("train: weights saved to %s\n", path.c_str());
  }
  if (!c.json.empty()) {
    std::string text = log.dump(1) + "\n";
    nn::write_file_atomically(c.json, {{text.data(), text.size()}});
  }
  return s;
}

// -------------------------------------------------------------------------------------------

BenchTrainResult bench_train(const BenchTrainOptions& o) {
  if (o.threads > 0) tensor::set_threads(o.threads);
  COHORT_CHECK(o.steps > 0 && o.warmup >= 0 && o.batch > 0,
               "bench train: steps " << o.steps << ", warmup " << o.warmup);
  auto model =
      nn::make_model(o.model, nn::ModelOptions{o.in_channels, o.num_classes, o.image_size, 0});
  nn::OptimOptions oo;
  oo.kind = o.optimizer;
  auto opt = nn::make_optimizer(*model, oo);
  Tensor x = Tensor::empty({o.batch, o.in_channels, o.image_size, o.image_size});
  nn::init::normal(x, 0.0, 1.0, 17);
  x = x.channels_last();
  Targets t;
  for (int i = 0; i < o.batch; ++i) t.classes.push_back((i * 7919) % o.num_classes);

  std::printf(
      "# cohort bench train: %s, batch %d, %dx%dx%d, %d threads, %s, %d steps after %d "
      "warmup\n",
      o.model.c_str(), o.batch, o.in_channels, o.image_size, o.image_size, tensor::threads(),
      o.optimizer.c_str(), o.steps, o.warmup);
  for (int i = 0; i < o.warmup; ++i) train_step(*model, *opt, x, t, 0.01f, 0.0f);
  nn::profile::reset();
  nn::profile::enable(o.profile);
  StepTimes times;
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = Clock::now();
    const float loss = train_step(*model, *opt, x, t, 0.01f, 0.0f, &times);
    ms.push_back(1e3 * seconds_since(t0));
    COHORT_CHECK(std::isfinite(loss), "bench train: loss " << loss << " at step " << i);
  }
  nn::profile::enable(false);
  BenchTrainResult r;
  double sum = 0;
  for (double v : ms) sum += v;
  r.ms_per_step = sum / o.steps;
  r.ms_min = *std::min_element(ms.begin(), ms.end());
  r.images_per_s = 1e3 * o.batch / r.ms_per_step;
  r.ms_forward = 1e3 * times.forward / o.steps;
  r.ms_backward = 1e3 * times.backward / o.steps;
  r.ms_optimizer = 1e3 * times.optimizer / o.steps;
  r.peak_rss = peak_rss_bytes();
  r.threads = tensor::threads();
  std::printf(
      "ms/step %.1f (min %.1f)  images/s %.2f  forward %.1f  backward %.1f  optimizer "
      "%.1f ms  peak RSS %.0f MB\n",
      r.ms_per_step, r.ms_min, r.images_per_s, r.ms_forward, r.ms_backward, r.ms_optimizer,
      r.peak_rss / 1e6);
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
    nlohmann::json j = {{"model", o.model},
                        {"batch", o.batch},
                        {"image_size", o.image_size},
                        {"in_channels", o.in_channels},
                        {"threads", r.threads},
                        {"steps", o.steps},
                        {"warmup", o.warmup},
                        {"ms_per_step", r.ms_per_step},
                        {"ms_min", r.ms_min},
                        {"ms_each", ms},
                        {"images_per_s", r.images_per_s},
                        {"ms_forward", r.ms_forward},
                        {"ms_backward", r.ms_backward},
                        {"ms_optimizer", r.ms_optimizer},
                        {"peak_rss_bytes", r.peak_rss},
                        {"split", split}};
    std::ofstream f(o.json);
    if (!f) COHORT_THROW("cannot write --json file '" << o.json << "'");
    f << j.dump(2) << "\n";
  }
  return r;
}

}  // namespace cohort::train
