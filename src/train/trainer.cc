#include "cohort/train/trainer.h"

#include <sched.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/comm/communicator.h"
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/data/pipeline.h"
#include "cohort/dist/checkpoint.h"
#include "cohort/dist/ddp.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/safetensors.h"
#include "cohort/train/metrics.h"

namespace cohort::train {

using nn::Var;
using tensor::Order;

float forward_backward(nn::Model& m, const Tensor& x, const Targets& t, float label_smoothing,
                       float loss_scale, dist::Ddp* ddp, bool sync, StepTimes* times) {
  auto t0 = Clock::now();
  nn::Tape tape;
  nn::Tape::Recording rec(tape);
  Var logits = m.forward(nn::constant(x));
  Var loss = t.multilabel.defined() ? nn::bce_with_logits(logits, t.multilabel)
                                    : nn::cross_entropy(logits, t.classes, label_smoothing);
  const float value = loss->value.data<float>()[0];
  auto t1 = Clock::now();
  if (ddp) ddp->prepare(tape, sync);
  // Under DDP the gradients come out already divided by the world size, so that the bucket
  // allreduce is a plain sum (an average would cost the collective another pass).
  tape.backward(loss, ddp ? loss_scale * ddp->gradient_scale() : loss_scale);
  if (times) {
    times->forward += std::chrono::duration<double>(t1 - t0).count();
    times->backward += seconds_since(t1);
  }
  return value;
}

float train_step(nn::Model& m, nn::Optimizer& opt, const Tensor& x, const Targets& t, float lr,
                 float label_smoothing, StepTimes* times, dist::Ddp* ddp) {
  m.zero_grad();
  const float loss = forward_backward(m, x, t, label_smoothing, 1.0f, ddp, true, times);
  if (ddp) {
    const double w = ddp->finish();
    if (times) times->comm_wait += w;
  }
  auto t3 = Clock::now();
  {
    nn::profile::Scope prof("optimizer");
    opt.step(lr);
  }
  if (times) times->optimizer += seconds_since(t3);
  return loss;
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

// Every rank evaluates its shard of the validation set; logits, targets and sample indices are
// gathered (the sampler gives every rank the same count, padding with repeats, which are
// dropped here by index), so every rank computes the same figures over each sample once.
// Compute threads when none were asked for: the cores this rank may run on, shared with the
// other ranks of this host when the launcher did not bind ranks to cores of their own.
void default_threads(int asked, const comm::JobEnv& job) {
  if (asked > 0) {
    tensor::set_threads(asked);
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  const int mine = CPU_COUNT(&set);
  const int all = static_cast<int>(std::thread::hardware_concurrency());
  const int share = mine >= all ? std::max(1, mine / std::max(1, job.local_world)) : mine;
  tensor::set_threads(share);
}

}  // namespace

EvalResult evaluate(nn::Model& m, data::Pipeline& p, bool multilabel, int classes,
                    comm::Communicator* world) {
  m.train(false);
  nn::NoGrad ng;
  std::vector<double> index;           // f64: exact for any data set index
  std::vector<float> logits, targets;  // targets: [n, classes] findings, or [n] class ids
  p.start_epoch(0);
  data::Batch b;
  while (p.next(&b)) {
    Targets t = batch_targets(b, multilabel, classes);
    Tensor z = m.forward(nn::constant(batch_tensor(b)))->value.contiguous();
    logits.insert(logits.end(), z.data<float>(), z.data<float>() + z.numel());
    for (int i = 0; i < b.size; ++i) {
      index.push_back(static_cast<double>(b.indices[i]));
      if (multilabel) {
        const float* row = t.multilabel.data<float>() + i * classes;
        targets.insert(targets.end(), row, row + classes);
      } else {
        targets.push_back(static_cast<float>(t.classes[i]));
      }
    }
  }
  m.train(true);
  if (world && world->size() > 1) {
    const size_t n = world->size();
    auto gather = [&](auto& v, comm::DataType t) {
      std::remove_reference_t<decltype(v)> all(v.size() * n);
      world->allgather(v.data(), all.data(), v.size(), t).wait();
      v.swap(all);
    };
    gather(index, comm::DataType::f64);
    gather(logits, comm::DataType::f32);
    gather(targets, comm::DataType::f32);
  }
  const size_t width = multilabel ? static_cast<size_t>(classes) : 1;
  std::vector<std::vector<float>> scores(multilabel ? classes : 1);
  std::vector<std::vector<int>> labels(scores.size());
  std::vector<char> seen;
  EvalResult r;
  double loss_sum = 0;
  size_t correct = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const size_t id = static_cast<size_t>(index[i]);
    if (id >= seen.size()) seen.resize(id + 1, 0);
    if (seen[id]) continue;
    seen[id] = 1;
    ++r.samples;
    const float* row = logits.data() + i * classes;
    const float* tr = targets.data() + i * width;
    if (multilabel) {
      for (int k = 0; k < classes; ++k) {
        const double x = row[k];
        loss_sum += (std::max(x, 0.0) - x * tr[k] + std::log1p(std::exp(-std::abs(x)))) / classes;
        scores[k].push_back(row[k]);
        labels[k].push_back(tr[k] > 0);
      }
      continue;
    }
    const int y = static_cast<int>(tr[0]);
    const float mx = *std::max_element(row, row + classes);
    double se = 0;
    for (int k = 0; k < classes; ++k) se += std::exp(static_cast<double>(row[k] - mx));
    loss_sum += mx + std::log(se) - row[y];
    correct += static_cast<int>(std::max_element(row, row + classes) - row) == y;
    if (classes == 2) {
      scores[0].push_back(row[1] - row[0]);  // monotone in softmax p(1)
      labels[0].push_back(y);
    }
  }
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

namespace {

// Sets the compute type of convolutions and Linear layers; says what runs in what.
std::string apply_precision(const std::string& p) {
  if (p == "f32") {
    nn::set_compute_type(tensor::DType::f32);
    return "f32";
  }
  const tensor::DType t = p == "bf16" ? tensor::DType::bf16 : tensor::DType::f16;
  if (nn::compute_type_supported(t)) {
    nn::set_compute_type(t);
    return p + ": convolutions and Linear layers in " + p +
           " (inputs converted on the way in), batch norm, activations, losses, gradients, "
           "master weights and optimiser state in f32" +
           (p == "f16" ? "; dynamic loss scaling" : "");
  }
  nn::set_compute_type(tensor::DType::f32);
  return p + " requested, but oneDNN has no " + p +
         " convolutions on this CPU: everything computes in f32" +
         (p == "f16" ? " (dynamic loss scaling still applies)" : "");
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nullptr;
}

}  // namespace

TrainSummary run_training(const TrainConfig& c) {
  COHORT_CHECK(!c.data.empty(), "cohort train needs --data (or 'data' in the config file)");
  comm::JobEnv job = comm::detect_job_env();
  std::shared_ptr<comm::Communicator> world;
  if (job.world > 1) world = comm::init();
  const bool lead = job.rank == 0;
  auto say = [&](const char* fmt, auto... args) {
    if (!lead) return;
    std::printf(fmt, args...);
    std::fflush(stdout);
  };
  default_threads(c.threads, job);
  const std::string precision_note = apply_precision(c.precision);
  const bool scaling = c.precision == "f16";

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
                                             pipeline_options(c, false, job.world, job.rank));
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

  const int64_t per_epoch = static_cast<int64_t>(train_p.batches_per_epoch()) / c.accum_steps;
  COHORT_CHECK(per_epoch > 0, c.data << ": " << train_p.batches_per_epoch()
                                     << " batches per rank per epoch, fewer than accum-steps "
                                     << c.accum_steps);
  std::unique_ptr<dist::Ddp> ddp;
  if (world) {
    // Every rank must see the same number of steps, or the ones with more would wait forever
    // in an allreduce: compare before the first step (the sampler pads, so only different data
    // or options per rank get here).
    int64_t mine[2] = {per_epoch, -per_epoch}, all[2];
    world->allreduce(mine, all, 2, comm::DataType::i64, comm::RedOp::min).wait();
    COHORT_CHECK(all[0] == per_epoch && -all[1] == per_epoch,
                 "ranks disagree on the steps per epoch: rank "
                     << job.rank << " has " << per_epoch << ", another has "
                     << (all[0] != per_epoch ? all[0] : -all[1])
                     << " (same --data, --batch and --accum-steps on every rank?)");
    dist::DdpOptions d;
    d.bucket_mb = c.bucket_mb;
    d.first_bucket_mb = c.first_bucket_mb;
    d.compression = c.grad_compression;
    ddp = std::make_unique<dist::Ddp>(*model, world, d);
    ddp->broadcast_from_rank0();
    if (c.sync_bn) dist::sync_batch_norm(*model, world);
  }

  const int64_t global_batch = int64_t{c.batch} * job.world * c.accum_steps;
  const float lr = c.lr_scaling == "linear"
                       ? nn::linear_scaled_lr(c.lr, global_batch, c.lr_reference_batch)
                       : c.lr;
  int64_t total = per_epoch * c.epochs;
  if (c.max_steps > 0) total = std::min(total, c.max_steps);
  nn::LrSchedule sched;
  sched.lr = lr;
  sched.kind = c.schedule;
  sched.warmup_steps = static_cast<int64_t>(std::llround(c.warmup_epochs * per_epoch));
  sched.total_steps = per_epoch * c.epochs;
  sched.step_every = int64_t{c.step_epochs} * per_epoch;

  dist::RunPosition pos;
  pos.seed = c.seed;
  pos.world = job.world;
  if (!c.resume.empty()) {
    // Rank 0 reads the checkpoint (no shared file system needed) and every rank takes its
    // parameters, buffers, optimiser state and position, as at the start of a run.
    if (lead) pos = dist::load_checkpoint(c.resume, *model, *opt);
    if (ddp) {
      int64_t f[5] = {pos.step, pos.epoch, static_cast<int64_t>(pos.position),
                      static_cast<int64_t>(pos.seed), opt->steps()};
      world->broadcast(f, f, 5, comm::DataType::i64, 0).wait();
      pos.step = f[0];
      pos.epoch = f[1];
      pos.position = static_cast<uint64_t>(f[2]);
      pos.seed = static_cast<uint64_t>(f[3]);
      opt->set_steps(f[4]);
      ddp->broadcast_from_rank0();
      for (auto& [name, t] : opt->state()) {
        world
            ->broadcast(t->raw(), t->raw(), static_cast<size_t>(t->numel()), comm::DataType::f32, 0)
            .wait();
      }
    }
    COHORT_CHECK(pos.seed == c.seed,
                 c.resume << ": checkpoint seed " << pos.seed << ", this run's " << c.seed);
    COHORT_CHECK(pos.position % static_cast<uint64_t>(c.batch * job.world * c.accum_steps) == 0,
                 c.resume << ": position " << pos.position
                          << " is not a whole number of global batches of "
                          << c.batch * job.world * c.accum_steps);
    say("train: resumed from %s at step %lld (epoch %lld, sample %llu)\n", c.resume.c_str(),
        static_cast<long long>(pos.step), static_cast<long long>(pos.epoch),
        static_cast<unsigned long long>(pos.position));
  }
  const std::string ckpt_dir = c.checkpoint_dir;

  say("train: %s (%lld parameters, %d input channels, %d %s) on %s: %zu samples, %d rank(s), "
      "%lld steps/epoch, batch %d x %d ranks x %d accumulation = %lld, %d compute threads, %d "
      "data workers\n",
      c.model.c_str(), static_cast<long long>(model->num_parameters()), in_ch, classes,
      c.multilabel ? "findings" : "classes", c.data.c_str(), source->size(), job.world,
      static_cast<long long>(per_epoch), c.batch, job.world, c.accum_steps,
      static_cast<long long>(global_batch), tensor::threads(), c.workers);
  if (ddp) {
    say("train: DDP over %s; %zu buckets (first %.2g MiB, then %.3g MiB), wire %s%s\n",
        world->describe().c_str(), ddp->buckets().size(), c.first_bucket_mb, c.bucket_mb,
        c.grad_compression == "none" ? "f32" : c.grad_compression.c_str(),
        c.sync_bn ? ", SyncBatchNorm" : "");
  }
  say("train: precision %s\n", precision_note.c_str());
  if (c.lr_scaling == "linear") {
    say("train: lr %g x global batch %lld / %d = %g (linear scaling rule), warmup %lld steps, "
        "then %s\n",
        c.lr, static_cast<long long>(global_batch), c.lr_reference_batch, lr,
        static_cast<long long>(sched.warmup_steps), c.schedule.c_str());
  } else {
    say("train: lr %g, warmup %lld steps, then %s\n", lr,
        static_cast<long long>(sched.warmup_steps), c.schedule.c_str());
  }

  nlohmann::json log = nlohmann::json::object();
  nlohmann::json cfg = nlohmann::json::object();
  for (const ConfigKey& k : train_config_keys()) cfg[k.name] = k.get(c);
  log["config"] = cfg;
  log["world"] = job.world;
  log["global_batch"] = global_batch;
  log["lr_effective"] = lr;
  log["parameters"] = model->num_parameters();
  log["steps"] = nlohmann::json::array();
  log["epochs"] = nlohmann::json::array();

  auto write_checkpoint = [&](const dist::RunPosition& at) {
    if (!lead || ckpt_dir.empty()) return;
    auto t0 = Clock::now();
    dist::save_checkpoint(ckpt_dir, *model, *opt, at);
    say("train: checkpoint at step %lld written to %s (%.2f s)\n", static_cast<long long>(at.step),
        dist::checkpoint_path(ckpt_dir).c_str(), seconds_since(t0));
  };

  TrainSummary s;
  s.first_step = pos.step;
  float loss_scale = scaling ? c.loss_scale : 1.0f;
  int good_steps = 0;
  int64_t skipped_steps = 0;
  auto t_run = Clock::now();
  int64_t step = pos.step;
  uint64_t images = 0;
  double sum_compute = 0, sum_comm = 0, sum_data = 0;
  double window_loss = 0, window_data = 0, window_compute = 0, window_comm = 0;
  int window_n = 0;
  uint64_t window_images = 0;
  auto t_window = Clock::now();
  const uint64_t samples_per_step = static_cast<uint64_t>(global_batch);
  for (int64_t epoch = pos.epoch; epoch < c.epochs && step < total; ++epoch) {
    const uint64_t from = epoch == pos.epoch ? pos.position : 0;
    train_p.start_epoch(static_cast<uint64_t>(epoch), from);
    double epoch_loss = 0;
    int64_t epoch_steps = 0;
    int64_t in_epoch = static_cast<int64_t>(from / samples_per_step);
    data::Batch b;
    while (step < total && in_epoch < per_epoch) {
      double data_s = 0, comm_s = 0;
      auto t_step = Clock::now();
      model->zero_grad();
      float loss = 0;
      int step_images = 0;
      for (int k = 0; k < c.accum_steps; ++k) {
        auto t0 = Clock::now();
        COHORT_CHECK(train_p.next(&b), "rank " << job.rank << " ran out of data at step " << step
                                               << " of epoch " << epoch);
        data_s += seconds_since(t0);
        loss += forward_backward(*model, batch_tensor(b), batch_targets(b, c.multilabel, classes),
                                 c.label_smoothing, loss_scale / static_cast<float>(c.accum_steps),
                                 ddp.get(), k == c.accum_steps - 1, nullptr) /
                static_cast<float>(c.accum_steps);
        step_images += b.size;
      }
      if (ddp) comm_s = ddp->finish();
      const float step_lr = sched.at(step);
      bool apply = true;
      if (scaling) {
        // Averaged gradients are the same on every rank, so every rank decides alike. A scaled
        // gradient beyond f16's largest value (65504) counts as an overflow even where the
        // kernels fell back to f32, so that the scale settles where f16 would hold it.
        if (!(tensor::max_abs(model->flat_grads()) <= 65504.0)) {
          apply = false;
          skipped_steps++;
          say("train: step %lld: gradients overflow f16 at loss scale %g; step skipped, scale now "
              "%g\n",
              static_cast<long long>(step + 1), loss_scale, loss_scale / 2);
          loss_scale /= 2;
          good_steps = 0;
        } else {
          tensor::scale_(model->flat_grads(), 1.0f / loss_scale);
          if (++good_steps == 2000) {
            loss_scale *= 2;
            good_steps = 0;
          }
        }
      }
      if (apply) {
        if (c.clip_grad_norm > 0) nn::clip_grad_norm(*model, c.clip_grad_norm);
        opt->step(step_lr);
      }
      const double compute_s = seconds_since(t_step) - data_s - comm_s;
      COHORT_CHECK(std::isfinite(loss), "loss is " << loss << " at step " << step << " (lr "
                                                   << step_lr << "): training diverged");
      ++step;
      ++epoch_steps;
      ++in_epoch;
      images += static_cast<uint64_t>(step_images) * job.world;
      s.losses.push_back(loss);
      epoch_loss += loss;
      sum_compute += compute_s;
      sum_comm += comm_s;
      sum_data += data_s;
      window_loss += loss;
      window_data += data_s;
      window_compute += compute_s;
      window_comm += comm_s;
      window_images += static_cast<uint64_t>(step_images) * job.world;
      ++window_n;
      const double step_s = compute_s + comm_s + data_s;
      log["steps"].push_back({{"step", step},
                              {"epoch", epoch},
                              {"loss", loss},
                              {"lr", step_lr},
                              {"compute_s", compute_s},
                              {"comm_wait_s", comm_s},
                              {"data_wait_s", data_s},
                              {"images_per_s", step_images * job.world / step_s}});
      if (step % c.log_every == 0 || step == total) {
        const double secs = seconds_since(t_window);
        const double eta = (total - step) * (seconds_since(t_run) / (step - s.first_step));
        say("epoch %lld/%d step %lld/%lld loss %.4f lr %.4g images/s %.1f compute %.0f ms "
            "comm wait %.0f ms data wait %.0f ms ETA %s\n",
            static_cast<long long>(epoch + 1), c.epochs, static_cast<long long>(step),
            static_cast<long long>(total), window_loss / window_n, step_lr, window_images / secs,
            1e3 * window_compute / window_n, 1e3 * window_comm / window_n,
            1e3 * window_data / window_n, hms(eta).c_str());
        window_loss = window_data = window_compute = window_comm = 0;
        window_n = 0;
        window_images = 0;
        t_window = Clock::now();
      }
      s.final_loss = loss;
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0 && step < total) {
        dist::RunPosition at = pos;
        at.step = step;
        at.epoch = in_epoch == per_epoch ? epoch + 1 : epoch;
        at.position =
            in_epoch == per_epoch ? 0 : static_cast<uint64_t>(in_epoch) * samples_per_step;
        write_checkpoint(at);
      }
    }
    nlohmann::json ej = {{"epoch", epoch},
                         {"train_loss", epoch_steps ? epoch_loss / epoch_steps : 0.0},
                         {"steps", epoch_steps}};
    if (val_p && in_epoch == per_epoch) {
      if (ddp) ddp->broadcast_buffers();  // as DDP's broadcast_buffers: rank 0's statistics
      EvalResult r = evaluate(*model, *val_p, c.multilabel, classes, world.get());
      s.last_val = r;
      s.has_val = true;
      say("epoch %lld/%d validation: %zu samples, loss %.4f", static_cast<long long>(epoch + 1),
          c.epochs, r.samples, r.loss);
      if (std::isfinite(r.accuracy)) say(", accuracy %.4f", r.accuracy);
      if (std::isfinite(r.auc)) say(", ROC AUC %.4f", r.auc);
      say("\n");
      ej["val_loss"] = r.loss;
      ej["val_accuracy"] = finite_or_null(r.accuracy);
      ej["val_auc"] = finite_or_null(r.auc);
    }
    log["epochs"].push_back(ej);
  }
  if (world) world->barrier().wait();  // every rank's last step is done before the summary
  s.steps = step;
  s.seconds = seconds_since(t_run);
  const int64_t ran = step - s.first_step;
  s.images_per_s = images / s.seconds;
  const data::PipelineStats ps = train_p.stats();
  say("train: %lld steps in %.1f s, %.1f images/s (all ranks), final loss %.4f, peak RSS %.0f "
      "MB, %llu unreadable samples skipped\n",
      static_cast<long long>(ran), s.seconds, s.images_per_s, s.final_loss, peak_rss_bytes() / 1e6,
      static_cast<unsigned long long>(ps.skipped));
  if (ran > 0) {
    say("train: per step: compute %.1f ms, exposed communication %.1f ms, data wait %.1f ms\n",
        1e3 * sum_compute / ran, 1e3 * sum_comm / ran, 1e3 * sum_data / ran);
  }
  nlohmann::json summary = {{"steps", ran},
                            {"seconds", s.seconds},
                            {"images_per_s", s.images_per_s},
                            {"final_loss", s.final_loss},
                            {"compute_ms", ran ? 1e3 * sum_compute / ran : 0.0},
                            {"comm_wait_ms", ran ? 1e3 * sum_comm / ran : 0.0},
                            {"data_wait_ms", ran ? 1e3 * sum_data / ran : 0.0},
                            {"peak_rss_bytes", peak_rss_bytes()},
                            {"skipped_samples", ps.skipped},
                            {"skipped_steps", skipped_steps},
                            {"loss_scale", loss_scale}};
  s.skipped_steps = skipped_steps;
  if (!c.baseline_json.empty() && lead) {
    std::ifstream in(c.baseline_json);
    COHORT_CHECK(in, "cannot read --baseline-json " << c.baseline_json);
    nlohmann::json base;
    try {
      base = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      COHORT_THROW("--baseline-json " << c.baseline_json << " is not JSON: " << e.what());
    }
    COHORT_CHECK(base.contains("summary") && base["summary"].contains("images_per_s"),
                 c.baseline_json << " is not a cohort train --json log");
    const double b1 = base["summary"]["images_per_s"].get<double>();
    const int bw = base.value("world", 1);
    const double eff = s.images_per_s / (b1 / bw * job.world);
    say("train: scaling efficiency %.3f against %s (%.1f images/s on %d rank(s))\n", eff,
        c.baseline_json.c_str(), b1, bw);
    summary["scaling_efficiency"] = eff;
  }
  log["summary"] = summary;
  if (lead) {
    dist::RunPosition end = pos;
    end.step = step;
    end.epoch = step / per_epoch;
    end.position = static_cast<uint64_t>(step % per_epoch) * samples_per_step;
    write_checkpoint(end);
  }
  if (!c.save.empty() && lead) {
    std::filesystem::create_directories(c.save);
    const std::string path = c.save + "/model.safetensors";
    nn::save_weights(*model, path,
                     {{"classes", std::to_string(classes)},
                      {"in_channels", std::to_string(in_ch)},
                      {"steps", std::to_string(step)}});
    say("train: weights saved to %s\n", path.c_str());
  }
  if (!c.json.empty() && lead) {
    std::string text = log.dump(1) + "\n";
    nn::write_file_atomically(c.json, {{text.data(), text.size()}});
  }
  if (world) world->barrier().wait();
  return s;
}

// -------------------------------------------------------------------------------------------

BenchTrainResult bench_train(const BenchTrainOptions& o) {
  COHORT_CHECK(o.steps > 0 && o.warmup >= 0 && o.batch > 0,
               "bench train: steps " << o.steps << ", warmup " << o.warmup);
  comm::JobEnv job = comm::detect_job_env();
  default_threads(o.threads, job);
  std::shared_ptr<comm::Communicator> world;
  if (job.world > 1) world = comm::init();
  const bool lead = job.rank == 0;
  const std::string precision_note = apply_precision(o.precision);
  auto model =
      nn::make_model(o.model, nn::ModelOptions{o.in_channels, o.num_classes, o.image_size, 0});
  nn::OptimOptions oo;
  oo.kind = o.optimizer;
  auto opt = nn::make_optimizer(*model, oo);
  std::unique_ptr<dist::Ddp> ddp;
  if (world) {
    ddp = std::make_unique<dist::Ddp>(*model, world, o.ddp);
    ddp->broadcast_from_rank0();
  }
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
    if (ddp) {
      std::printf("# DDP: %zu buckets (first %.2g MiB, then %.3g MiB), wire %s, %s\n",
                  ddp->buckets().size(), o.ddp.first_bucket_mb, o.ddp.bucket_mb,
                  o.ddp.compression.c_str(), world->describe().c_str());
    }
  }
  for (int i = 0; i < o.warmup; ++i)
    train_step(*model, *opt, x, t, 0.01f, 0.0f, nullptr, ddp.get());
  if (world) world->barrier().wait();
  nn::profile::reset();
  nn::profile::enable(o.profile);
  StepTimes times;
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = Clock::now();
    const float loss = train_step(*model, *opt, x, t, 0.01f, 0.0f, &times, ddp.get());
    ms.push_back(1e3 * seconds_since(t0));
    COHORT_CHECK(std::isfinite(loss), "bench train: loss " << loss << " at step " << i);
  }
  nn::profile::enable(false);
  BenchTrainResult r;
  r.world = job.world;
  double sum = 0;
  for (double v : ms) sum += v;
  r.ms_per_step = sum / o.steps;
  r.ms_min = *std::min_element(ms.begin(), ms.end());
  std::vector<double> per_rank(static_cast<size_t>(job.world), r.ms_per_step);
  if (world) {
    world->allgather(&r.ms_per_step, per_rank.data(), 1, comm::DataType::f64).wait();
  }
  const double slowest = *std::max_element(per_rank.begin(), per_rank.end());
  r.images_per_s = 1e3 * o.batch * job.world / slowest;
  r.ms_forward = 1e3 * times.forward / o.steps;
  r.ms_backward = 1e3 * times.backward / o.steps;
  r.ms_optimizer = 1e3 * times.optimizer / o.steps;
  r.ms_comm_wait = 1e3 * times.comm_wait / o.steps;
  r.peak_rss = peak_rss_bytes();
  r.threads = tensor::threads();
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
    nlohmann::json j = {{"model", o.model},
                        {"batch", o.batch},
                        {"image_size", o.image_size},
                        {"in_channels", o.in_channels},
                        {"threads", r.threads},
                        {"world", r.world},
                        {"precision", o.precision},
                        {"steps", o.steps},
                        {"warmup", o.warmup},
                        {"ms_per_step", r.ms_per_step},
                        {"ms_per_step_per_rank", per_rank},
                        {"ms_min", r.ms_min},
                        {"ms_each", ms},
                        {"images_per_s", r.images_per_s},
                        {"ms_forward", r.ms_forward},
                        {"ms_backward", r.ms_backward},
                        {"ms_comm_wait", r.ms_comm_wait},
                        {"ms_optimizer", r.ms_optimizer},
                        {"peak_rss_bytes", r.peak_rss},
                        {"peak_tensor_bytes", mem.peak_in_use},
                        {"split", split}};
    std::ofstream f(o.json);
    if (!f) COHORT_THROW("cannot write --json file '" << o.json << "'");
    f << j.dump(2) << "\n";
  }
  return r;
}

}  // namespace cohort::train
