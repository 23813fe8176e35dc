// The input pipeline: a reader (ImageFolder or CSV list, sharded by the Sampler), operators
// (decode, crop/resize, flip, jitter, normalize) run by a thread pool, and batches assembled
// into preallocated aligned buffers handed over through a bounded prefetch queue. Memory does
// not grow with the data set; every sample's randomness is keyed on (seed, epoch, sample).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/rng.h"
#include "cohort/data/dicom.h"
#include "cohort/data/image.h"
#include "cohort/data/sampler.h"
#include "cohort/data/source.h"

namespace cohort::data {

enum class Layout { nchw, nhwc };
enum class OutType { f32, bf16, u8 };
// Where a stage runs (--decode, --augment-on). On the GPU the batch ends in device memory.
enum class Placement { cpu, gpu };
const char* placement_name(Placement p);  // "cpu", "gpu"
class DeviceStage;
struct DeviceItem;
struct CropBox;

struct PipelineOptions {
  int batch = 32;
  int workers = 2;
  int prefetch = 2;  // batches ready ahead of the consumer
  int size = 224;    // output height and width
  uint64_t seed = 0;
  bool train = true;             // random-resized-crop + flips; otherwise resize + center crop
  double crop_scale_min = 0.08;  // random-resized-crop's smallest area fraction
  double crop_ratio_min = 3.0 / 4, crop_ratio_max = 4.0 / 3;  // its aspect ratio range
  int resize = 256;  // eval: shorter side before the center crop
  bool hflip = true;
  bool vflip = false;
  double rotation = 0;                              // random turn within +-degrees (0: off)
  float brightness = 0, contrast = 0;               // jitter amplitudes (0: off)
  int channels = 0;                                 // 0: as decoded; 3: gray repeated to 3 channels
  std::vector<float> mean{0.485f, 0.456f, 0.406f};  // applied to values scaled to [0, 1]
  std::vector<float> std{0.229f, 0.224f, 0.225f};
  Layout layout = Layout::nchw;
  OutType out = OutType::f32;
  bool fail_on_corrupt = false;  // default: skip, warn and count
  Idct idct = Idct::fast;        // JPEG inverse DCT
  bool hash_samples = false;     // fill Batch::sample_hashes (determinism checks)
  std::optional<Window> window;  // DICOM: overrides the files' window center/width
  int world = 1, rank = 0;
  bool shuffle = true, drop_last = false;
  int sampler_groups = 1;  // ranks of a larger world this rank stands in for (SamplerOptions)
  // Decoding on the GPU: JPEG's IDCT, upsampling and colour (entropy decoding stays on the CPU),
  // DICOM's rescale and window; needs augment on the GPU too. The operators after decoding on
  // the GPU: crop and resize, flips, rotation, brightness and contrast, normalisation. Either
  // needs this process's CUDA device chosen (cuda::use_device) first. hash_samples is CPU only.
  Placement decode = Placement::cpu, augment = Placement::cpu;
};

struct Batch {
  const uint8_t* data = nullptr;  // size x C x H x W (or NHWC), OutType
  bool on_device = false;         // data is in this process's CUDA device's memory
  int size = 0;                   // samples in this batch (the last may be short)
  int channels = 0, height = 0, width = 0;
  std::vector<int> labels;                   // first label of each sample (-1: none)
  std::vector<std::vector<int>> label_sets;  // every label of each sample (multi-label CSV)
  std::vector<size_t> indices;               // data set index of each sample
  std::vector<uint64_t> sample_hashes;       // per sample output hash (for determinism checks)
  size_t bytes = 0;
};

struct PipelineStats {
  uint64_t images = 0, skipped = 0, batches = 0;
  double read_s = 0, decode_s = 0, resize_s = 0, post_s = 0;  // summed over workers
  double consumer_wait_s = 0;
  double mean_queue = 0;  // ready batches seen by the consumer, on average
  double device_s = 0;    // the device stage's batches, summed (host time until each is done)
  std::string placement;  // where each stage ran: "decode cpu, augment cpu"
};

class Pipeline {
 public:
  Pipeline(std::shared_ptr<const Source> source, PipelineOptions opt);
  Pipeline(std::vector<Sample> samples, PipelineOptions opt)
      : Pipeline(file_source(std::move(samples)), std::move(opt)) {}
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Starts an epoch at a global position (resume); batches then come in order. With `to`,
  // only this rank's share of positions [from, to) (Sampler::indices), which may be none.
  void start_epoch(uint64_t epoch, size_t from = 0, size_t to = SIZE_MAX);
  // The next batch of the epoch, valid until the next call; false at the end of the epoch.
  bool next(Batch* out);
  // The next batch, valid until release(ticket), across epochs; nullopt at the end of the epoch.
  // Held batches keep their buffers; when the consumer holds every buffer, one more is added.
  std::optional<size_t> acquire(Batch* out);
  void release(size_t ticket);
  PipelineStats stats() const;
  const Sampler& sampler() const { return sampler_; }
  size_t batches_per_epoch() const;
  int channels() const { return channels_; }
  bool pinned() const { return pinned_; }  // batch buffers are page-locked (CUDA present)
  bool on_device() const { return device_ != nullptr; }

 private:
  struct Slot;
  void add_slot();
  void worker_loop();
  void run_task(size_t task, Slot& slot);
  void stop_workers();

  void prepare_device_item(DeviceItem& item, std::span<const uint8_t> bytes,
                           const std::string& name, const ImageInfo& info, const CropBox& box,
                           CounterRng& rng);
  void stage_batch(Slot& s);
  bool ready(const Slot& s) const;  // its samples done (and, on the device, the batch staged)

  std::shared_ptr<const Source> source_;
  PipelineOptions opt_;
  std::unique_ptr<DeviceStage> device_;  // --decode/--augment-on gpu
  Sampler sampler_;
  int channels_ = 0;
  size_t sample_bytes_ = 0;
  size_t batch_bytes_ = 0;
  bool pinned_ = false;

  std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  std::vector<std::unique_ptr<Slot>> slots_;  // prefetch + 1 batch buffers, more if held
  std::vector<Slot*> free_;                   // slots neither filled nor held
  std::vector<Slot*> batch_slot_;             // the slot of each batch of the epoch, once claimed
  std::vector<size_t> order_;                 // this rank's indices for the epoch
  uint64_t epoch_ = 0;
  size_t next_task_ = 0;             // next (batch, sample) to claim
  size_t handed_next_ = 0;           // the next batch to hand to the consumer
  std::optional<size_t> last_auto_;  // the slot next() handed out last
  int inflight_ = 0;                 // tasks being run by workers
  std::exception_ptr error_;         // a worker's failure (policy fail), rethrown by next()
  size_t num_batches_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;

  mutable std::mutex stats_mu_;
  PipelineStats stats_;
  double queue_sum_ = 0;
};

}  // namespace cohort::data
