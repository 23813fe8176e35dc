// Everything `cohort train` takes, as flags or as a config file (JSON or TOML) with the same
// keys. One table of keys serves the flags, the files and the log, so the three never disagree.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cohort/dist/data_parallel.h"

namespace cohort::train {

// Choices given as names in flags and files, parsed once where the configuration is read.
enum class Precision { f32, bf16, f16 };  // convolutions and Linear layers
enum class LrScaling { none, linear };    // linear: lr x global batch / reference batch
const char* precision_name(Precision p);
const char* lr_scaling_name(LrScaling s);

struct TrainConfig {
  std::string model = "resnet18";
  std::string data, val, save, json;
  int epochs = 1;
  int batch = 32;  // per rank
  float lr = 0.1f;
  std::string optimizer = "sgd";
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
  bool nesterov = false;
  std::string schedule = "cosine";  // cosine | step | constant
  float warmup_epochs = 0;
  int step_epochs = 30;                    // step schedule: x0.1 every this many epochs
  LrScaling lr_scaling = LrScaling::none;  // Goyal et al., reference batch 256
  int lr_reference_batch = 256;
  float label_smoothing = 0;
  int image_size = 224;
  // Augmentation (docs/training.md). Defaults suit scans: no flips (anatomy is not
  // mirror-symmetric), no rotation and no intensity jitter (scans are acquired upright and
  // their intensities carry meaning), torchvision's random-resized-crop.
  float crop_scale = 0.08f;  // random-resized-crop's smallest area fraction
  float crop_ratio_min = 0.75f, crop_ratio_max = 4.0f / 3;
  bool hflip = false, vflip = false;
  float rotation = 0;                         // degrees, +-
  float brightness = 0, contrast = 0;         // jitter amplitudes
  float window_center = 0, window_width = 0;  // DICOM window; width 0: each file's own
  int in_channels = 0;                        // 0: as the data decodes
  int num_classes = 0;                        // 0: from the data's labels
  bool multilabel = false;                    // BCE over findings instead of softmax over classes
  int workers = 2;
  int threads = 0;  // compute threads; 0: the cores this rank may use
  int log_every = 10;
  int64_t max_steps = 0;  // stop early (0: run every epoch)
  uint64_t seed = 0;
  // Data parallel (under cohort launch, torchrun, mpirun or srun).
  int accum_steps = 1;  // micro-batches per optimiser step; only the last communicates
  float bucket_mb = 25, first_bucket_mb = 1;
  dist::Compression reduce_dtype = dist::Compression::none;  // what gradients are reduced in
  // Sharding (docs/training.md): none is DDP.
  dist::Shard shard = dist::Shard::none;
  bool reshard_after_forward = true;
  int max_prefetch = 1;
  bool accum_local_grads = false;
  uint64_t max_memory = 0;  // bytes per rank; 0: no cap
  bool sync_bn = false;
  // Pipeline parallelism (dist::Pipeline): stages > 0 cuts the model; --batch is then each
  // replica's mini-batch, split into micro_batches.
  int pipeline_stages = 0;
  int micro_batches = 1;
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b (--schedule is the learning rate's)
  std::string pipeline_cuts;               // "3,7,12": the first piece of stages 1..S-1
  std::string pipeline_balance = "flops";  // flops | time
  bool deferred_batch_norm = false;
  bool recompute = false;
  float clip_grad_norm = 0;      // 0: off
  int64_t checkpoint_every = 0;  // steps; 0: only at the end when checkpoint-dir is set
  std::string checkpoint_dir, resume, baseline_json;
  std::string report;  // a folder: rank 0 writes the run's page there at the end (cohort report)
  // Mixed precision: convolutions and Linear layers in bf16 or f16 (f32 master weights,
  // gradients and optimiser state); f16 adds dynamic loss scaling.
  Precision precision = Precision::f32;
  // Where the model trains: cpu, or cuda (each rank takes the GPU of its local rank).
  tensor::Device device = tensor::Device::cpu;
  // Where the input pipeline decodes and augments: auto (the GPU when training on one), cpu or gpu.
  std::string decode = "auto", augment_on = "auto";
  float loss_scale = 65536;  // f16: the initial dynamic loss scale
  // --resume at a position that is no whole number of this layout's batches (docs/training.md):
  // auto (exact where the layout can run the leftover samples as a shorter first step, else
  // repeat), exact (refuse where it cannot), repeat (back to the last micro-batch boundary) or
  // skip (on to the next one).
  std::string resume_policy = "auto";
  std::string sample_log;  // every rank writes the data set indices of each micro-batch here
};

struct ConfigKey {
  std::string name;  // as a flag: --name; in a file: name (or name with '_' for '-')
  std::string help;
  std::function<void(TrainConfig&, const std::string&)> set;  // throws naming key and value
  std::function<std::string(const TrainConfig&)> get;
  bool is_flag = false;  // a boolean switch
};

const std::vector<ConfigKey>& train_config_keys();
// Sets one key from text; unknown keys and malformed values are errors naming them.
void set_config_key(TrainConfig& c, const std::string& key, const std::string& value,
                    const std::string& origin);
// "8G", "512M", "1000": bytes (K, M, G, T are powers of 1024); errors name the key.
uint64_t parse_byte_size(const std::string& key, const std::string& text);
// Applies a JSON (.json) or TOML (anything else) file's keys over c.
void apply_config_file(TrainConfig& c, const std::string& path);

}  // namespace cohort::train
