// A training run's set-up: the world, compute threads and precision, the data pipelines, the
// model and optimiser, DDP (and SyncBN), the learning-rate schedule, the resume, and the lines
// that say what the run is.
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <thread>

#include "cohort/core/clock.h"
#include "cohort/core/cuda.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/nn/layers.h"
#include "run.h"

namespace cohort::train {

namespace {

data::PipelineOptions pipeline_options(const TrainConfig& c, bool train, int world, int rank) {
  data::PipelineOptions po;
  po.batch = c.batch;
  po.workers = c.workers;
  po.size = c.image_size;
  po.seed = c.seed;
  po.train = train;
  po.crop_scale_min = c.crop_scale;
  po.crop_ratio_min = c.crop_ratio_min;
  po.crop_ratio_max = c.crop_ratio_max;
  po.hflip = c.hflip;
  po.vflip = c.vflip;
  po.rotation = c.rotation;
  po.brightness = c.brightness;
  po.contrast = c.contrast;
  if (c.window_width > 0) po.window = data::Window{c.window_center, c.window_width};
  po.resize = c.image_size;  // validation sees the whole (square) scan
  po.layout = data::Layout::nhwc;
  po.out = data::OutType::f32;
  po.channels = c.in_channels == 3 ? 3 : 0;
  po.world = world;
  po.rank = rank;
  po.shuffle = train;
  auto place = [&](const std::string& v, const char* key) {
    const bool gpu = v == "gpu" || (v == "auto" && c.device == tensor::Device::cuda);
    COHORT_CHECK(!gpu || c.device == tensor::Device::cuda,
                 "--" << key
                      << " gpu needs --device cuda (the batch would be on a GPU the "
                         "model is not on)");
    return gpu ? data::Placement::gpu : data::Placement::cpu;
  };
  po.decode = place(c.decode, "decode");
  po.augment = place(c.augment_on, "augment-on");
  return po;
}

std::string fmt_number(double v) {
  char s[32];
  std::snprintf(s, sizeof(s), "%g", v);
  return s;
}

void announce(const Run& r) {
  const TrainConfig& c = r.c;
  r.say(
      "train: %s (%lld parameters, %d input channels, %d %s) on %s: %zu samples, %d rank(s), "
      "%lld steps/epoch, batch %d x %d %s x %d accumulation = %lld, %d compute threads, %d "
      "data workers\n",
      c.model.c_str(), static_cast<long long>(r.model->num_parameters()), r.in_channels, r.classes,
      c.multilabel ? "findings" : "classes", c.data.c_str(), r.source->size(), r.job.world,
      static_cast<long long>(r.per_epoch), c.batch,
      static_cast<int>(r.global_batch / (int64_t{c.batch} * c.accum_steps)),
      r.pipe ? "replicas" : "ranks", c.accum_steps, static_cast<long long>(r.global_batch),
      tensor::threads(), c.workers);
  if (r.pipe) {
    r.say("train: pipeline: %s%s%s\n", r.pipe->describe().c_str(),
          c.deferred_batch_norm ? "\ntrain: BatchNorm running statistics deferred to the whole "
                                  "mini-batch"
                                : "",
          c.recompute ? "\ntrain: activations recomputed in backward" : "");
  }
  if (r.dp) {
    r.say("train: %s%s\n", r.dp->describe().c_str(), c.sync_bn ? "; SyncBatchNorm" : "");
    if (c.accum_steps > 1) {
      const bool once =
          c.shard == dist::Shard::none || c.shard == dist::Shard::zero1 || c.accum_local_grads;
      r.say("train: accumulation over %d micro-batches: %s\n", c.accum_steps,
            once ? "full local gradients, reduced once per step"
                 : "each micro-batch reduce-scattered into the shard (no full-size gradients "
                   "kept)");
    }
  }
  r.say("train: precision %s\n", r.precision_note.c_str());
  r.say(
      "train: augmentation: random-resized-crop scale [%g, 1] ratio [%g, %g], horizontal flip "
      "%s, vertical flip %s, rotation %s, brightness %g, contrast %g, DICOM window %s\n",
      c.crop_scale, c.crop_ratio_min, c.crop_ratio_max, c.hflip ? "on" : "off",
      c.vflip ? "on" : "off",
      c.rotation > 0 ? ("+-" + fmt_number(c.rotation) + " degrees").c_str() : "off", c.brightness,
      c.contrast,
      c.window_width > 0
          ? ("center " + fmt_number(c.window_center) + " width " + fmt_number(c.window_width))
                .c_str()
          : "each file's own");
  if (c.lr_scaling == LrScaling::linear) {
    r.say(
        "train: lr %g x global batch %lld / %d = %g (linear scaling rule), warmup %lld steps, "
        "then %s\n",
        c.lr, static_cast<long long>(r.global_batch), c.lr_reference_batch, r.lr,
        static_cast<long long>(r.sched.warmup_steps), c.schedule.c_str());
  } else {
    r.say("train: lr %g, warmup %lld steps, then %s\n", r.lr,
          static_cast<long long>(r.sched.warmup_steps), c.schedule.c_str());
  }
}

// Positions [a, b) of an epoch's global order, for the log: "sample positions 8..11 of epoch 0
// (data set indices 17, 3, 40, 22)".
std::string positions_text(const Run& r, uint64_t epoch, uint64_t a, uint64_t b) {
  std::ostringstream o;
  o << "sample position" << (b - a == 1 ? " " : "s ") << a;
  if (b - a > 1) o << ".." << b - 1;
  o << " of epoch " << epoch << " (data set indices ";
  const std::vector<size_t> order = r.train->sampler().global_order(epoch);
  for (uint64_t p = a; p < b && p < a + 16; ++p) o << (p > a ? ", " : "") << order[p];
  o << (b - a > 16 ? ", ...)" : ")");
  return o.str();
}

// A resume at a position that is no whole number of this layout's global batches (another
// world size, batch or accumulation than the run that wrote the checkpoint). --resume-policy:
// exact trains the samples left of that step as a shorter first step (the trainer's loop: a
// micro-batch's leftover dealt over the ranks from the position, some ranks taking fewer or
// none, then the step's remaining whole micro-batches, the loss averaged over the samples the
// step has); repeat goes back, skip goes on, to a micro-batch boundary, naming the positions.
// A pipeline runs whole mini-batches only, and SyncBatchNorm cannot leave a rank without a
// sample (it would count that rank's stand-in), so there auto is repeat. When the global batch
// changed, the step count becomes this layout's (epoch x steps per epoch + steps into it), so
// that the learning-rate schedule goes on at the same sample.
void place_resume(Run& r, bool piped, int data_world) {
  const TrainConfig& c = r.c;
  const uint64_t gb = static_cast<uint64_t>(r.global_batch);
  const uint64_t total = r.train->sampler().total_size();
  const uint64_t micro = piped ? gb : static_cast<uint64_t>(c.batch) * data_world;
  const uint64_t end = std::min(static_cast<uint64_t>(r.per_epoch) * gb, total);  // last step's
  const uint64_t epoch = static_cast<uint64_t>(r.pos.epoch);
  uint64_t& at = r.pos.position;
  if (at % gb != 0 && at < end) {
    const uint64_t back = at - at % micro, on = std::min(back + micro, total);
    const uint64_t step_end = std::min(at - at % gb + gb, total);
    std::ostringstream why;  // why this layout cannot train the leftover exactly
    if (piped) {
      why << "a pipeline runs whole mini-batches of " << c.batch << " per replica only";
    } else if (c.sync_bn && at % micro != 0 && on - at < static_cast<uint64_t>(data_world)) {
      why << "SyncBatchNorm: the " << on - at << " sample(s) left of the micro-batch leave "
          << static_cast<uint64_t>(data_world) - (on - at) << " of the " << data_world
          << " ranks without one";
    }
    std::ostringstream head;
    head << "position " << at << " of epoch " << epoch << " is not a whole number of global "
         << "batches of " << gb << " (" << data_world << (piped ? " replicas" : " ranks")
         << " x batch " << c.batch << " x accumulation " << c.accum_steps << ")";
    std::string policy = c.resume_policy;
    if (policy == "auto") policy = why.str().empty() ? "exact" : "repeat";
    if (policy != "exact" && at % micro == 0 && why.str().empty()) {
      // On a micro-batch boundary the shorter first step is whole micro-batches: nothing to
      // repeat or skip.
      r.say(
          "train: resume: position %llu lies on a micro-batch boundary of %llu: --resume-policy "
          "%s has nothing to repeat or skip\n",
          static_cast<unsigned long long>(at), static_cast<unsigned long long>(micro),
          policy.c_str());
      policy = "exact";
    }
    COHORT_CHECK(policy != "exact" || why.str().empty(),
                 c.resume << ": " << head.str()
                          << ", and this layout cannot train the samples left of that step as a "
                             "shorter first step ("
                          << why.str() << "); --resume-policy repeat trains "
                          << (back < at ? positions_text(r, epoch, back, at) : "nothing")
                          << " again, --resume-policy skip skips "
                          << positions_text(r, epoch, at, on));
    if (policy == "exact") {
      std::ostringstream what;
      what << "the first step trains the " << step_end - at << " sample(s) left of step "
           << at / gb + 1 << " of the epoch (positions " << at << ".." << step_end - 1 << ")";
      if (at % micro != 0) {
        what << ": positions " << at << ".." << on - 1 << " dealt over the ranks (";
        for (int k = 0; k < data_world; ++k) {
          const uint64_t n = on > at + k ? (on - at - k - 1) / data_world + 1 : 0;
          what << (k ? ", " : "") << n;
        }
        what << " sample(s) on ranks 0.." << data_world - 1 << ")";
        if (step_end > on) what << ", then " << (step_end - on) / micro << " whole micro-batch(es)";
      }
      what << ", its loss averaged over those samples; steps of " << gb << " go on from position "
           << step_end;
      r.say("train: resume: %s: %s\n", head.str().c_str(), what.str().c_str());
    } else if (policy == "repeat") {
      r.say("train: resume: %s: %s are trained again (--resume-policy repeat%s)\n",
            head.str().c_str(), positions_text(r, epoch, back, at).c_str(),
            why.str().empty() ? "" : (", since " + why.str()).c_str());
      at = back;
    } else {
      r.say("train: resume: %s: %s are skipped (--resume-policy skip)\n", head.str().c_str(),
            positions_text(r, epoch, at, on).c_str());
      at = on;
    }
  }
  if (at > 0 && at >= end) {
    // Past this layout's last step of the epoch (its steps stop at position `end`).
    if (at < total) {
      r.say("train: resume: %s are past this layout's last step of the epoch and are not trained\n",
            positions_text(r, epoch, at, total).c_str());
    }
    r.pos.epoch += 1;
    at = 0;
  }
  const int64_t saved = r.pos.global_batch;  // the checkpoint's (0: not recorded)
  if (saved > 0 && saved != r.global_batch) {
    const int64_t step = r.pos.epoch * r.per_epoch + static_cast<int64_t>(at / gb);
    if (step != r.pos.step) {
      r.say(
          "train: resume: step %lld of the checkpoint (global batch %lld) is step %lld of this "
          "layout (global batch %lld): the learning-rate schedule goes on at sample %llu of "
          "epoch %lld\n",
          static_cast<long long>(r.pos.step), static_cast<long long>(saved),
          static_cast<long long>(step), static_cast<long long>(r.global_batch),
          static_cast<unsigned long long>(at), static_cast<long long>(r.pos.epoch));
      r.pos.step = step;
    }
  }
}

}  // namespace

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

std::string apply_precision(Precision p) {
  if (p == Precision::f32) {
    nn::set_compute_type(tensor::DType::f32);
    return "f32";
  }
  const std::string name = precision_name(p);
  const tensor::DType t = p == Precision::bf16 ? tensor::DType::bf16 : tensor::DType::f16;
  const bool f16 = p == Precision::f16;
  if (nn::compute_type_supported(t)) {
    nn::set_compute_type(t);
    return name + ": convolutions and Linear layers in " + name +
           " (inputs converted on the way in), batch norm, activations, losses, gradients, "
           "master weights and optimiser state in f32" +
           (f16 ? "; dynamic loss scaling" : "");
  }
  nn::set_compute_type(tensor::DType::f32);
  return name + " requested, but oneDNN has no " + name +
         " convolutions on this CPU: everything computes in f32" +
         (f16 ? " (dynamic loss scaling still applies)" : "");
}

std::string choose_device(tensor::Device d, const comm::JobEnv& job) {
  if (d == tensor::Device::cpu) return "cpu";
  const int gpu = job.local_rank;
  const std::string from = job.launcher == "mpirun"   ? "OMPI_COMM_WORLD_LOCAL_RANK"
                           : job.launcher == "slurm"  ? "SLURM_LOCALID"
                           : job.launcher == "single" ? "one process"
                                                      : "LOCAL_RANK";
  cuda::use_device(gpu,
                   "--device cuda (local rank " + std::to_string(gpu) + ", from " + from + ")");
  const cuda::DeviceInfo g = cuda::info(gpu);
  // The device is chosen and usable; the layers that would run on it are not there yet.
  COHORT_THROW("--device cuda: cuda:" << gpu << " (" << g.name
                                      << ") is usable, but this build cannot train on it yet: "
                                         "its cuDNN and cuBLASLt layers are still to come "
                                         "(issue 36); --device cpu trains on the CPU");
}

Run set_up(const TrainConfig& config) {
  COHORT_CHECK(!config.data.empty(), "cohort train needs --data (or 'data' in the config file)");
  Run r;
  r.c = config;
  const TrainConfig& c = r.c;  // a restart on another world may raise its accumulation
  const double started_at = unix_seconds();
  r.job = comm::detect_job_env();
  const bool piped = c.pipeline_stages > 0;
  if (r.job.world > 1 || piped) r.world = comm::init();
  // Under a pipeline the data is sharded by replica: a replica's stages read the same batches
  // (the first stage takes the images, the last the labels).
  int data_world = r.job.world, data_rank = r.job.rank;
  if (piped) {
    COHORT_CHECK(r.job.world % c.pipeline_stages == 0,
                 "--pipeline-stages " << c.pipeline_stages << " does not divide the " << r.job.world
                                      << " ranks");
    COHORT_CHECK(c.batch % c.micro_batches == 0, "--batch " << c.batch
                                                            << " is not a multiple of "
                                                               "--micro-batches "
                                                            << c.micro_batches);
    data_world = r.job.world / c.pipeline_stages;
    data_rank = r.job.rank / c.pipeline_stages;
  }
  r.lead = r.job.rank == 0;
  default_threads(c.threads, r.job);
  choose_device(c.device, r.job);
  r.precision_note = apply_precision(c.precision);

  r.source = data::open_source(c.data);
  COHORT_CHECK(r.source->size() > 0, "training data " << c.data << " holds no samples");
  r.classes = c.num_classes;
  r.class_names = r.source->class_names();
  int mx = -1;
  for (size_t i = 0; i < r.source->size(); ++i) {
    const auto& labels = r.source->labels(i);
    if (labels.empty() && !c.multilabel) {
      COHORT_THROW(c.data << ": " << r.source->name(i)
                          << " has no label (a findings table: train it with --multilabel)");
    }
    for (int l : labels) mx = std::max(mx, l);
  }
  if (r.classes == 0) {
    r.classes = std::max({mx + 1, 2, static_cast<int>(r.class_names.size())});
  }
  // Restarted by `cohort launch --max-restarts` (or torchrun): continue from the run's own
  // checkpoint, when it wrote one before the failure. With fewer (or more) ranks than the run
  // that wrote it, the global batch is kept by changing the accumulation, where it divides.
  // No shared file system is assumed: each host reads its own copy of the folder, and
  // share_checkpoint first fetches what this host lacks from the others.
  auto share = [&](const std::string& dir) {
    const dist::SharedCheckpoint s = dist::share_checkpoint(dir, r.world.get());
    if (s.files_passed > 0) {
      r.say(
          "train: checkpoint at step %lld: %d file(s) (%.1f MB) that a host lacked in %s were "
          "passed from another host\n",
          static_cast<long long>(s.step), s.files_passed, s.bytes_passed / 1e6, dir.c_str());
    }
    return s.found;
  };
  std::string resume = c.resume;
  if (!resume.empty()) share(resume);
  const std::string generation = env::get_or("COHORT_RESTART_COUNT", "0");
  std::string batch_change;
  int sampler_groups = 1;
  if (generation != "0") {
    const bool have = !c.checkpoint_dir.empty() && resume.empty() && share(c.checkpoint_dir);
    if (resume.empty() && have) resume = c.checkpoint_dir;
    const std::string failed = env::get_or("COHORT_RESTART_FAILED_AT", "");
    r.restart = {{"generation", std::stoi(generation)},
                 {"failed_at", failed.empty() ? 0.0 : std::stod(failed)},
                 {"started_at", started_at},
                 {"set_up_at", 0.0},
                 {"resumed_from", resume},
                 {"world", r.job.world}};
    r.say("train: restart: generation %s, %d rank(s), %s\n", generation.c_str(), r.job.world,
          resume.empty() ? "no checkpoint to resume from (--checkpoint-dir), starting over"
                         : ("resuming from " + resume).c_str());
    // The world and global batch to keep: the checkpoint's, or, before the first checkpoint,
    // the first generation's (COHORT_RESTART_FIRST_WORLD, from the launcher).
    dist::RunPosition saved;
    if (!resume.empty()) {
      saved = dist::read_checkpoint_position(resume);
    } else if (const int first = static_cast<int>(env::int_or("COHORT_RESTART_FIRST_WORLD", 0));
               first > 0) {
      saved.world = first;
      const int first_data_world = piped ? first / c.pipeline_stages : first;
      saved.global_batch = int64_t{c.batch} * first_data_world * c.accum_steps;
    }
    if (saved.global_batch > 0) {
      const int64_t per_micro = int64_t{c.batch} * data_world;
      const int64_t now = per_micro * c.accum_steps;
      r.restart["saved_world"] = saved.world;
      if (saved.global_batch != now) {
        const int saved_data_world =
            piped ? saved.world / c.pipeline_stages : saved.world;  // same stages on resume
        const int64_t saved_accum =
            std::max<int64_t>(1, saved.global_batch / (int64_t{c.batch} * saved_data_world));
        std::ostringstream what;
        what << "world " << saved.world << " -> " << r.job.world << ": ";
        if (saved.global_batch % per_micro == 0) {
          const int accum = static_cast<int>(saved.global_batch / per_micro);
          what << "accumulation " << c.accum_steps << " -> " << accum
               << " keeps the global batch of " << saved.global_batch;
          r.c.accum_steps = accum;
          if (saved_data_world > data_world && saved_data_world % data_world == 0 &&
              accum == saved_accum * (saved_data_world / data_world)) {
            // Each rank takes the batches of saved/now ranks of the old world in turn: every
            // step sees the old run's micro-batches (BatchNorm included).
            sampler_groups = accum / saved_accum;
            what << "; each rank takes the batches of " << sampler_groups
                 << " ranks of the old world in turn";
          }
        } else {
          const int accum = static_cast<int>(
              std::max<int64_t>(1, (saved.global_batch + per_micro / 2) / per_micro));
          what << "the global batch of " << saved.global_batch << " is not a multiple of batch "
               << c.batch << " x " << data_world << " ranks; it becomes " << per_micro * accum
               << " (accumulation " << c.accum_steps << " -> " << accum << ")";
          r.c.accum_steps = accum;
        }
        batch_change = what.str();
        r.restart["accum_steps"] = c.accum_steps;
        r.say("train: restart: %s\n", batch_change.c_str());
      }
    }
  }

  data::PipelineOptions train_po = pipeline_options(c, true, data_world, data_rank);
  train_po.sampler_groups = sampler_groups;
  r.train = std::make_unique<data::Pipeline>(r.source, train_po);
  if (!c.val.empty()) {
    r.val = std::make_unique<data::Pipeline>(data::open_source(c.val),
                                             pipeline_options(c, false, r.job.world, r.job.rank));
  }
  r.in_channels = r.train->channels();
  COHORT_CHECK(
      c.in_channels == 0 || c.in_channels == r.in_channels,
      "in-channels " << c.in_channels << " but " << c.data << " decodes to " << r.in_channels);

  r.model =
      nn::make_model(c.model, nn::ModelOptions{r.in_channels, r.classes, c.image_size, c.seed});
  COHORT_CHECK(
      r.job.world > 1 || c.shard == dist::Shard::none,
      "--shard " << dist::shard_name(c.shard) << " needs several ranks (this run has one)");
  // A configuration that cannot fit stops here, with the estimate and the modes that would.
  dist::DdpOptions d;
  d.shard = c.shard;
  d.bucket_mb = c.bucket_mb;
  d.first_bucket_mb = c.first_bucket_mb;
  d.compression = c.reduce_dtype;
  d.reshard_after_forward = c.reshard_after_forward;
  d.max_prefetch = c.max_prefetch;
  d.accumulate_locally = c.accum_local_grads;
  // (A pipeline stage holds a part of the model state: its cap is checked after each step.)
  if (!piped) {
    dist::check_fits(*r.model, r.job.world, r.job.local_world, c.shard,
                     state_bytes(c.optimizer, c.momentum), d, c.max_memory);
  }

  r.per_epoch = static_cast<int64_t>(r.train->batches_per_epoch()) / c.accum_steps;
  COHORT_CHECK(r.per_epoch > 0, c.data << ": " << r.train->batches_per_epoch()
                                       << " batches per rank per epoch, fewer than accum-steps "
                                       << c.accum_steps);
  if (piped) {
    dist::PipelineOptions po;
    po.stages = c.pipeline_stages;
    po.micro_batches = c.micro_batches;
    po.schedule = dist::parse_schedule(c.pipeline_schedule);
    po.balance = c.pipeline_balance;
    po.deferred_batch_norm = c.deferred_batch_norm;
    po.recompute = c.recompute;
    po.shard = c.shard;
    po.sync_batch_norm = c.sync_bn;
    for (size_t at = 0; at < c.pipeline_cuts.size();) {
      size_t end = c.pipeline_cuts.find(',', at);
      if (end == std::string::npos) end = c.pipeline_cuts.size();
      const std::string v = c.pipeline_cuts.substr(at, end - at);
      try {
        po.cuts.push_back(std::stoi(v));
      } catch (const std::exception&) {
        COHORT_THROW("--pipeline-cuts '" << c.pipeline_cuts << "': '" << v
                                         << "' is not a piece number");
      }
      at = end + 1;
    }
    r.pipe = std::make_unique<dist::Pipeline>(
        *r.model, r.world, po,
        tensor::Shape{c.batch / c.micro_batches, r.in_channels, c.image_size, c.image_size});
  }
  if (r.world) {
    // Every rank must see the same number of steps, or the ones with more would wait forever
    // in an allreduce: compare before the first step (the sampler pads, so only different data
    // or options per rank get here).
    int64_t mine[2] = {r.per_epoch, -r.per_epoch}, all[2];
    r.world->allreduce(mine, all, 2, comm::DataType::i64, comm::RedOp::min).wait();
    COHORT_CHECK(all[0] == r.per_epoch && -all[1] == r.per_epoch,
                 "ranks disagree on the steps per epoch: rank "
                     << r.job.rank << " has " << r.per_epoch << ", another has "
                     << (all[0] != r.per_epoch ? all[0] : -all[1])
                     << " (same --data, --batch and --accum-steps on every rank?)");
    if (!piped) {
      r.dp = dist::make_data_parallel(*r.model, r.world, d);
      if (c.sync_bn) dist::sync_batch_norm(*r.model, r.world);
    }
  }
  r.target = r.dp     ? r.dp->optim_target()
             : r.pipe ? r.pipe->optim_target()
                      : nn::whole_model(*r.model);
  nn::OptimOptions oo;
  oo.kind = c.optimizer;
  oo.momentum = c.momentum;
  oo.nesterov = c.nesterov;
  oo.weight_decay = c.weight_decay;
  r.opt = nn::make_optimizer(r.target, oo);

  r.global_batch = int64_t{c.batch} * data_world * c.accum_steps;
  r.lr = c.lr_scaling == LrScaling::linear
             ? nn::linear_scaled_lr(c.lr, r.global_batch, c.lr_reference_batch)
             : c.lr;
  r.total = r.per_epoch * c.epochs;
  if (c.max_steps > 0) r.total = std::min(r.total, c.max_steps);
  r.sched.lr = r.lr;
  r.sched.kind = c.schedule;
  r.sched.warmup_steps = static_cast<int64_t>(std::llround(c.warmup_epochs * r.per_epoch));
  r.sched.total_steps = r.per_epoch * c.epochs;
  r.sched.step_every = int64_t{c.step_epochs} * r.per_epoch;

  r.pos.seed = c.seed;
  if (!resume.empty()) {
    r.pos = dist::load_checkpoint(resume, *r.model, r.opt.get(), r.target);
    if (r.dp) r.dp->after_step();  // the loaded shards to where forward reads them
    if (r.pipe) r.pipe->after_step();
    COHORT_CHECK(r.pos.seed == c.seed,
                 resume << ": checkpoint seed " << r.pos.seed << ", this run's " << c.seed);
    place_resume(r, piped, data_world);
    r.say("train: resumed from %s at step %lld (epoch %lld, sample %llu)\n", resume.c_str(),
          static_cast<long long>(r.pos.step), static_cast<long long>(r.pos.epoch),
          static_cast<unsigned long long>(r.pos.position));
  }
  r.pos.world = r.job.world;  // this run's checkpoints record this run's world and mode
  r.pos.global_batch = r.global_batch;
  r.pos.mode =
      piped ? "pipeline-" + std::to_string(c.pipeline_stages) + "x" + std::to_string(data_world)
            : dist::shard_name(c.shard);
  if (!r.restart.is_null()) r.restart["set_up_at"] = unix_seconds();
  announce(r);
  return r;
}

}  // namespace cohort::train
