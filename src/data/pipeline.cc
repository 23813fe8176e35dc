#include "cohort/data/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/clock.h"
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/core/half.h"
#include "cohort/core/log.h"
#include "cohort/core/rng.h"
#include "cohort/data/image.h"
#include "cohort/data/ops.h"
#include "device_stage.h"
#include "kernels/augment_math.h"

namespace fs = std::filesystem;

namespace cohort::data {

// ---------------------------------------------------------------- pipeline
namespace {

// Batch memory: page-locked when this process trains on a CUDA device (copies to it then run at
// full speed and asynchronously), 64-byte aligned host memory otherwise. Not before the device
// is chosen: pinning would open a context on GPU 0 in every rank of a node.
uint8_t* alloc_batch(size_t bytes, bool* pinned) {
  if (cuda::device_chosen()) {
    try {
      *pinned = true;
      return static_cast<uint8_t*>(cuda::alloc_pinned(bytes));
    } catch (const Error& e) {
      // Page-locked memory is limited (RLIMIT_MEMLOCK, the driver): pageable memory still
      // works, at the cost of synchronous copies.
      COHORT_LOG(warn, "data: batch buffer not page-locked (" << e.message() << ")");
    }
  }
  *pinned = false;
  return static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
}

void free_batch(uint8_t* p, bool pinned) {
  if (pinned) {
    cuda::free_pinned(p);
    return;
  }
  std::free(p);
}

// A training sample's augmentation after its crop, drawn from its random stream in one order
// whichever device applies it: the flips, the angle (only when rotation is on, so that other runs
// keep their streams), brightness (in the image's range: `bits`) and contrast.
AugmentParams draw_augment(CounterRng& rng, const PipelineOptions& o, const CropBox& box,
                           int bits) {
  AugmentParams p;
  p.box = box;
  if (!o.train) return p;
  p.hflip = o.hflip && rng.uniform() < 0.5;
  p.vflip = o.vflip && rng.uniform() < 0.5;
  if (o.rotation > 0) p.degrees = rng.uniform(-o.rotation, o.rotation);
  if (o.brightness > 0 || o.contrast > 0) {
    const float maxv = bits == 16 ? 65535.f : 255.f;
    p.jitter = true;
    p.brightness = static_cast<float>(rng.uniform(-o.brightness, o.brightness)) * maxv;
    p.contrast = static_cast<float>(rng.uniform(1.0 - o.contrast, 1.0 + o.contrast));
  }
  return p;
}

}  // namespace

const char* placement_name(Placement p) {
  return p == Placement::gpu ? "gpu" : "cpu";
}

struct Pipeline::Slot {
  uint8_t* data = nullptr;
  bool pinned = false;
  ~Slot() {
    if (data) free_batch(data, pinned);
  }
  size_t batch = SIZE_MAX;
  bool held = false;  // handed to the consumer and not yet released
  int count = 0;
  int done = 0;
  // The device stage (--decode/--augment-on gpu): the batch in device memory, each sample's
  // prepared item, and whether the stage has run (a batch is ready once it has).
  void* device = nullptr;
  std::vector<std::unique_ptr<DeviceItem>> items;
  bool staged = false;
  std::vector<size_t> indices;
  std::vector<uint64_t> hashes;
  std::vector<uint8_t> valid;
};

bool Pipeline::ready(const Slot& s) const {
  return s.done == s.count && (!device_ || s.staged);
}

namespace {
thread_local std::vector<float> t_planes;
}

Pipeline::Pipeline(std::shared_ptr<const Source> source, PipelineOptions opt)
    : source_(std::move(source)),
      opt_(std::move(opt)),
      sampler_(source_->size(), opt_.world, opt_.rank,
               SamplerOptions{opt_.seed, opt_.shuffle, opt_.drop_last, opt_.sampler_groups,
                              static_cast<size_t>(opt_.batch)}) {
  COHORT_CHECK(opt_.batch >= 1, "batch " << opt_.batch);
  COHORT_CHECK(opt_.workers >= 1 && opt_.workers <= 256, "workers " << opt_.workers);
  COHORT_CHECK(opt_.prefetch >= 1 && opt_.prefetch <= 64, "prefetch " << opt_.prefetch);
  COHORT_CHECK(opt_.size >= 1 && opt_.size <= 16384, "size " << opt_.size);
  COHORT_CHECK(
      opt_.crop_ratio_min > 0 && opt_.crop_ratio_min <= opt_.crop_ratio_max,
      "crop aspect ratio range [" << opt_.crop_ratio_min << ", " << opt_.crop_ratio_max << "]");
  COHORT_CHECK(opt_.rotation >= 0 && opt_.rotation <= 180, "rotation " << opt_.rotation);
  // Channels come from the first readable sample's header, so every batch has one shape.
  // Unreadable samples before it are skipped here as the workers will skip them (or refused).
  std::vector<uint8_t> first;
  ImageInfo info;
  for (size_t i = 0;; ++i) {
    try {
      info = probe(source_->bytes(i, first), source_->name(i));
      break;
    } catch (const Error& e) {
      if (opt_.fail_on_corrupt || i + 1 >= source_->size()) throw;
      COHORT_LOG(warn,
                 "cannot read " << source_->name(i) << " for the batch shape: " << e.message());
    }
  }
  channels_ = opt_.channels == 3 ? 3 : info.channels;
  if (opt_.decode == Placement::gpu || opt_.augment == Placement::gpu) {
    COHORT_CHECK(opt_.augment == Placement::gpu,
                 "--decode gpu needs --augment-on gpu: the images it decodes stay on the device");
    COHORT_CHECK(!opt_.hash_samples,
                 "--digest hashes batches in host memory: it needs --decode "
                 "cpu --augment-on cpu");
    device_ = make_device_stage(opt_, channels_);
    stats_.placement = device_->describe();
  } else {
    stats_.placement = "decode cpu, augment cpu";
  }
  const size_t elem = opt_.out == OutType::f32 ? 4 : opt_.out == OutType::bf16 ? 2 : 1;
  sample_bytes_ = static_cast<size_t>(channels_) * opt_.size * opt_.size * elem;
  batch_bytes_ = (sample_bytes_ * opt_.batch + 63) & ~size_t(63);
  for (int i = 0; i < opt_.prefetch + 1; ++i) add_slot();
  for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

void Pipeline::add_slot() {
  auto s = std::make_unique<Slot>();
  if (device_) {
    s->device = device_->alloc_batch(batch_bytes_);
    s->items.resize(static_cast<size_t>(opt_.batch));
  } else {
    s->data = alloc_batch(batch_bytes_, &s->pinned);
    if (!s->data) COHORT_THROW("cannot allocate " << batch_bytes_ << " bytes for a batch");
    pinned_ = s->pinned;
  }
  s->indices.resize(static_cast<size_t>(opt_.batch));
  s->hashes.resize(static_cast<size_t>(opt_.batch));
  s->valid.resize(static_cast<size_t>(opt_.batch));
  free_.push_back(s.get());
  slots_.push_back(std::move(s));
}

Pipeline::~Pipeline() {
  stop_workers();
  if (device_) {
    for (auto& s : slots_)
      if (s->device) device_->free_batch(s->device);
  }
}

void Pipeline::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

size_t Pipeline::batches_per_epoch() const {
  size_t per = sampler_.per_rank();
  return (per + static_cast<size_t>(opt_.batch) - 1) / static_cast<size_t>(opt_.batch);
}

void Pipeline::start_epoch(uint64_t epoch, size_t from, size_t to) {
  std::unique_lock<std::mutex> lock(mu_);
  // Wait for tasks of the previous epoch still running: they write into the slots.
  ready_cv_.wait(lock, [&] { return inflight_ == 0; });
  order_ = sampler_.indices(epoch, from, to);
  epoch_ = epoch;
  next_task_ = 0;
  handed_next_ = 0;
  num_batches_ =
      (order_.size() + static_cast<size_t>(opt_.batch) - 1) / static_cast<size_t>(opt_.batch);
  // A batch next() handed out is given back; batches acquired and not released stay held.
  if (last_auto_) slots_[*last_auto_]->held = false;
  last_auto_.reset();
  free_.clear();
  for (auto& s : slots_) {
    s->batch = SIZE_MAX;
    if (!s->held) free_.push_back(s.get());
  }
  batch_slot_.assign(num_batches_, nullptr);
  lock.unlock();
  work_cv_.notify_all();
}

void Pipeline::worker_loop() {
  const size_t B = static_cast<size_t>(opt_.batch);
  while (true) {
    size_t t;
    Slot* slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Batches are claimed in order; a batch's first task takes a free slot for it.
      work_cv_.wait(lock, [&] {
        return stop_ || (next_task_ < order_.size() &&
                         (batch_slot_[next_task_ / B] != nullptr || !free_.empty()));
      });
      if (stop_) return;
      t = next_task_++;
      const size_t k = t / B;
      if (!batch_slot_[k]) {
        batch_slot_[k] = free_.back();
        free_.pop_back();
      }
      slot = batch_slot_[k];
      Slot& s = *slot;
      if (t % B == 0) {  // the first task of a batch prepares its slot
        s.batch = k;
        s.done = 0;
        s.count = static_cast<int>(std::min(B, order_.size() - k * B));
        s.staged = false;
        std::fill(s.valid.begin(), s.valid.end(), 0);
      }
      ++inflight_;
    }
    std::exception_ptr err;
    try {
      run_task(t, *slot);
    } catch (...) {
      err = std::current_exception();
    }
    // The consumer is woken when it has something to act on (a finished batch, an error, or
    // no task in flight for a drain), not after every sample, which cost a context switch per
    // image on the cores the workers decode on (the gain is within bench data's noise on 2 cores).
    bool complete = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      Slot& s = *slot;
      if (s.batch == t / B) ++s.done;
      complete = s.batch == t / B && s.done == s.count;
    }
    // The worker that completes a batch runs the device stage on it, still counted in flight (a
    // new epoch waits for it before reusing the slot).
    if (complete && device_) {
      std::exception_ptr stage_err;
      try {
        stage_batch(*slot);
      } catch (...) {
        stage_err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (stage_err && !error_) error_ = stage_err;
    }
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --inflight_;
      if (complete) slot->staged = true;
      wake = err || complete || inflight_ == 0 || error_;
    }
    if (wake) ready_cv_.notify_all();
  }
}

void Pipeline::stage_batch(Slot& s) {
  std::vector<DeviceItem*> items;
  for (int j = 0; j < s.count; ++j)
    if (s.valid[static_cast<size_t>(j)]) items.push_back(s.items[static_cast<size_t>(j)].get());
  auto t0 = Clock::now();
  device_->run(items, s.device);
  for (auto& it : s.items) it.reset();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.device_s += seconds_since(t0);
}

// A sample for the device stage: the same draws as the CPU path, and the decoding that stays on
// the CPU (entropy decoding of a JPEG; all of a PNG; a JPEG or DICOM layout the device declines).
void Pipeline::prepare_device_item(DeviceItem& item, std::span<const uint8_t> bytes,
                                   const std::string& name, const ImageInfo& info,
                                   const CropBox& box, CounterRng& rng) {
  int bits = 8;
  if (item.dicom) {
    if (info.channels == 1 && opt_.decode == Placement::gpu) {
      item.kind = DeviceItem::Kind::dicom;
      bits = 16;
    } else {  // windowed here (--decode cpu), or 8-bit RGB, which has no window to run
      item.image = item.dicom->window(opt_.window);
      bits = item.image.bits;
      item.dicom.reset();
    }
  } else if (info.format == Format::jpeg && opt_.decode == Placement::gpu &&
             read_jpeg_coefficients(bytes, name, &item.jpeg, nullptr)) {
    item.kind = DeviceItem::Kind::jpeg;
  } else {
    item.image = decode(bytes, name, 8, opt_.idct);
    bits = item.image.bits;
  }
  const int C = item.kind == DeviceItem::Kind::image ? item.image.channels : info.channels;
  if (C != 1 && C != channels_) {
    COHORT_THROW_AS(DecodeError, name << " has " << C << " channels, the batch has " << channels_);
  }
  item.params = draw_augment(rng, opt_, box, bits);
  // Only a DICOM scan is read from its file's bytes later.
  if (item.kind != DeviceItem::Kind::dicom) std::vector<uint8_t>().swap(item.file);
}

void Pipeline::run_task(size_t t, Slot& s) {
  const size_t B = static_cast<size_t>(opt_.batch);
  const size_t idx = order_[t];
  const size_t j = t % B;
  const std::string name = source_->name(idx);
  CounterRng rng(key3(opt_.seed, epoch_, idx));
  const int S = opt_.size;
  auto t0 = Clock::now();
  double read_s = 0, decode_s = 0, resize_s = 0, post_s = 0;
  try {
    // For the device stage a file is read into memory its sample keeps (a DICOM scan's stored
    // values are read from the file's bytes when its batch is staged); a source's own memory
    // (mapped shards) outlives the pipeline and is used where it lies.
    std::unique_ptr<DeviceItem> item;
    if (device_) item = std::make_unique<DeviceItem>();
    thread_local std::vector<uint8_t> scratch;
    std::span<const uint8_t> bytes = source_->bytes(idx, item ? item->file : scratch);
    auto t1 = Clock::now();
    read_s = std::chrono::duration<double>(t1 - t0).count();
    // A DICOM file is parsed once, for its size and then for the crop's pixels.
    std::optional<DicomPixels> dicom;
    if (sniff(bytes.data(), bytes.size()) == Format::dicom) {
      if (item) {
        item->dicom = std::make_unique<DicomPixels>(bytes, name);
      } else {
        dicom.emplace(bytes, name);
      }
    }
    const ImageInfo info = item && item->dicom ? item->dicom->info()
                           : dicom             ? dicom->info()
                                               : probe(bytes, name);
    CropBox box = opt_.train
                      ? random_resized_crop_box(info.width, info.height, rng, opt_.crop_scale_min,
                                                1.0, opt_.crop_ratio_min, opt_.crop_ratio_max)
                      : resize_center_crop_box(info.width, info.height, opt_.resize, S);
    if (device_) {
      prepare_device_item(*item, bytes, name, info, box, rng);
      s.items[j] = std::move(item);
      auto t1d = Clock::now();
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.read_s += read_s;
      stats_.decode_s += std::chrono::duration<double>(t1d - t1).count();
      ++stats_.images;
      s.indices[j] = idx;
      s.hashes[j] = 0;
      s.valid[j] = 1;
      return;
    }
    // The image the crop is resampled from: a DICOM scan's stored values, windowed row by row
    // as the resampler reads them (only the crop's rows and columns, and no windowed copy of
    // them in memory: 2048 px scans, 4 MB a crop), or a decoded image.
    RowSource rows;
    Image img;
    CropBox sbox = box;  // the crop in the decoded image's pixels
    if (info.format == Format::dicom) {
      rows = dicom->rows(opt_.window);
    } else if (info.format == Format::jpeg) {
      // Only the crop's blocks (and two pixels around it for the resampling taps) are decoded,
      // downscaled in the DCT domain as far as the crop allows.
      const int e = jpeg_scale_for(static_cast<int>(box.w), static_cast<int>(box.h), S);
      const int x0 = std::max(0, static_cast<int>(std::floor(box.x)) - 2);
      const int y0 = std::max(0, static_cast<int>(std::floor(box.y)) - 2);
      const int x1 = std::min(info.width, static_cast<int>(std::ceil(box.x + box.w)) + 2);
      const int y1 = std::min(info.height, static_cast<int>(std::ceil(box.y + box.h)) + 2);
      PixelRegion at;
      img =
          decode_jpeg_region(bytes, name, e, opt_.idct, PixelRegion{x0, y0, x1 - x0, y1 - y0}, &at);
      const double sx = static_cast<double>((info.width * e + 7) / 8) / info.width;
      const double sy = static_cast<double>((info.height * e + 7) / 8) / info.height;
      sbox = CropBox{box.x * sx - at.x, box.y * sy - at.y, box.w * sx, box.h * sy};
    } else {
      img = decode(bytes, name, 8, opt_.idct);
    }
    const int C = rows.row ? rows.channels : img.channels;
    const int bits = rows.row ? rows.bits : img.bits;
    if (C != info.channels) {
      COHORT_THROW_AS(DecodeError, name << ": " << C << " channels after decoding");
    }
    auto t2 = Clock::now();
    decode_s = std::chrono::duration<double>(t2 - t1).count();
    if (C != 1 && C != channels_) {
      COHORT_THROW_AS(DecodeError,
                      name << " has " << C << " channels, the batch has " << channels_);
    }
    const size_t plane = static_cast<size_t>(S) * S;
    t_planes.resize(plane * static_cast<size_t>(channels_));
    float* p = t_planes.data();
    if (rows.row) {
      resize_crop(rows, sbox, S, S, p);
    } else {
      resize_crop(img, sbox, S, S, p);
    }
    auto t3 = Clock::now();
    resize_s = std::chrono::duration<double>(t3 - t2).count();
    const AugmentParams a = draw_augment(rng, opt_, box, bits);
    if (a.hflip) flip_horizontal(p, C, S, S);
    if (a.vflip) flip_vertical(p, C, S, S);
    if (a.degrees != 0) {
      thread_local std::vector<float> scratch;
      rotate(p, C, S, S, a.degrees, scratch);
    }
    if (a.jitter) brightness_contrast(p, C, S, S, a.brightness, a.contrast);
    for (int c = C; c < channels_; ++c) std::memcpy(p + c * plane, p, plane * sizeof(float));
    // Normalize (x / max - mean) / std = x * a + b, and write in the batch's layout and type.
    const float inv = 1.f / (bits == 16 ? 65535.f : 255.f);
    uint8_t* dst = s.data + j * sample_bytes_;
    for (int c = 0; c < channels_; ++c) {
      const float m = opt_.mean[std::min<size_t>(c, opt_.mean.size() - 1)];
      const float sd = opt_.std[std::min<size_t>(c, opt_.std.size() - 1)];
      const float* q = p + c * plane;
      if (opt_.out == OutType::f32) {
        const float a = inv / sd, b = -m / sd;
        float* o = reinterpret_cast<float*>(dst);
        if (opt_.layout == Layout::nchw) {
          o += c * plane;
          for (size_t i = 0; i < plane; ++i) o[i] = kernels::normalize_point(q[i], a, b);
        } else {
          for (size_t i = 0; i < plane; ++i)
            o[i * channels_ + c] = kernels::normalize_point(q[i], a, b);
        }
      } else if (opt_.out == OutType::bf16) {
        const float a = inv / sd, b = -m / sd;
        uint16_t* o = reinterpret_cast<uint16_t*>(dst);
        for (size_t i = 0; i < plane; ++i) {
          const size_t at = opt_.layout == Layout::nchw ? c * plane + i : i * channels_ + c;
          o[at] = f32_to_bf16(kernels::normalize_point(q[i], a, b));
        }
      } else {
        const float a = inv * 255.f;
        for (size_t i = 0; i < plane; ++i) {
          const size_t o = opt_.layout == Layout::nchw ? c * plane + i : i * channels_ + c;
          dst[o] = kernels::u8_point(q[i], a);
        }
      }
    }
    uint64_t h = 0;
    if (opt_.hash_samples) {
      h = mix64(idx);
      const uint64_t* w = reinterpret_cast<const uint64_t*>(dst);
      for (size_t i = 0; i < sample_bytes_ / 8; ++i) h = mix64(h ^ w[i]);
      for (size_t i = sample_bytes_ / 8 * 8; i < sample_bytes_; ++i) h = mix64(h ^ dst[i]);
    }
    post_s = seconds_since(t3);
    s.indices[j] = idx;
    s.hashes[j] = h;
    s.valid[j] = 1;
  } catch (const Error& e) {
    if (opt_.fail_on_corrupt) throw;
    COHORT_LOG(warn, "skipping " << name << ": " << e.message());
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.skipped;
    return;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.images;
  stats_.read_s += read_s;
  stats_.decode_s += decode_s;
  stats_.resize_s += resize_s;
  stats_.post_s += post_s;
}

bool Pipeline::next(Batch* out) {
  if (last_auto_) release(*last_auto_);  // the previous batch's buffer goes back to the workers
  last_auto_ = acquire(out);
  return last_auto_.has_value();
}

void Pipeline::release(size_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = *slots_.at(ticket);
    COHORT_CHECK(s.held, "batch buffer " << ticket << " released twice");
    s.held = false;
    s.batch = SIZE_MAX;
    free_.push_back(&s);
    if (last_auto_ == ticket) last_auto_.reset();
  }
  work_cv_.notify_all();
}

std::optional<size_t> Pipeline::acquire(Batch* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (handed_next_ >= num_batches_) return std::nullopt;
  const size_t k = handed_next_;
  if (!batch_slot_[k] && free_.empty()) {
    // Every buffer is held by the consumer (tensors still alive): one more, so that the
    // pipeline goes on; memory then grows with what the consumer keeps, not with the data.
    add_slot();
    if (slots_.size() == static_cast<size_t>(opt_.prefetch) + 2) {
      COHORT_LOG(info, "the consumer holds all " << slots_.size() - 1
                                                 << " batch buffers; the pipeline adds more as "
                                                    "needed");
    }
    work_cv_.notify_all();
  }
  int ready = 0;
  for (size_t b = k; b < num_batches_ && batch_slot_[b] && this->ready(*batch_slot_[b]); ++b)
    ++ready;
  auto t0 = Clock::now();
  ready_cv_.wait(
      lock, [&] { return error_ || stop_ || (batch_slot_[k] && this->ready(*batch_slot_[k])); });
  if (error_) std::rethrow_exception(error_);
  if (stop_) return std::nullopt;
  Slot& s = *batch_slot_[k];
  const double waited = seconds_since(t0);
  // Skipped samples leave holes: close them up so the batch is dense (the device stage wrote
  // its batch dense already).
  int n = 0;
  for (int j = 0; j < s.count; ++j) {
    if (!s.valid[static_cast<size_t>(j)]) continue;
    if (n != j) {
      if (!device_) {
        std::memmove(s.data + n * sample_bytes_, s.data + j * sample_bytes_, sample_bytes_);
      }
      s.indices[static_cast<size_t>(n)] = s.indices[static_cast<size_t>(j)];
      s.hashes[static_cast<size_t>(n)] = s.hashes[static_cast<size_t>(j)];
    }
    ++n;
  }
  out->data = device_ ? static_cast<const uint8_t*>(s.device) : s.data;
  out->on_device = device_ != nullptr;
  out->size = n;
  out->channels = channels_;
  out->height = opt_.size;
  out->width = opt_.size;
  // Labels come from the source by index: the slot keeps only which samples it holds.
  out->labels.resize(static_cast<size_t>(n));
  out->label_sets.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    out->label_sets[i] = source_->labels(s.indices[i]);
    out->labels[i] = out->label_sets[i].empty() ? -1 : out->label_sets[i].front();
  }
  out->indices.assign(s.indices.begin(), s.indices.begin() + n);
  out->sample_hashes.assign(s.hashes.begin(), s.hashes.begin() + n);
  out->bytes = sample_bytes_ * static_cast<size_t>(n);
  s.held = true;
  ++handed_next_;
  size_t ticket = 0;
  while (slots_[ticket].get() != &s) ++ticket;
  std::lock_guard<std::mutex> sl(stats_mu_);
  ++stats_.batches;
  stats_.consumer_wait_s += waited;
  queue_sum_ += ready;
  stats_.mean_queue = queue_sum_ / static_cast<double>(stats_.batches);
  return ticket;
}

PipelineStats Pipeline::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace cohort::data
