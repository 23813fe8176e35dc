// The data pipeline's device stage (see device_stage.h) where the GPU parts are built: JPEG
// coefficients through DeviceJpegDecoder, DICOM stored values through DeviceDicomWindow, images
// decoded on the CPU copied up as they are, then DeviceAugment for the whole batch; all on the
// copy stream.
#include <cstring>
#include <mutex>
#include <sstream>

#include "augment_device.h"
#include "cohort/core/cuda.h"
#include "device_buffer.h"
#include "device_stage.h"
#include "dicom_device.h"
#include "jpeg_device.h"

namespace cohort::data {

namespace {

kernels::BatchType batch_type(OutType t) {
  return t == OutType::f32    ? kernels::BatchType::f32
         : t == OutType::bf16 ? kernels::BatchType::bf16
                              : kernels::BatchType::u8;
}

class CudaStage final : public DeviceStage {
 public:
  CudaStage(const PipelineOptions& o, int channels)
      : o_(o),
        augment_(o.size, channels, o.mean, o.std, batch_type(o.out), o.layout == Layout::nhwc) {}

  void* alloc_batch(size_t bytes) override {
    void* p = cuda::device_malloc(bytes);
    COHORT_CHECK(p, "out of device memory for a batch of " << bytes << " bytes");
    return p;
  }
  void free_batch(void* p) override { cuda::device_free(p); }

  void run(const std::vector<DeviceItem*>& items, void* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    const cuda::Stream s = cuda::Stream::copy();
    // JPEGs decode together; DICOM scans are windowed one by one into slots of their own; images
    // decoded on the CPU are copied up (staged through pinned memory).
    std::vector<JpegCoefficients> jpegs;
    for (DeviceItem* it : items)
      if (it->kind == DeviceItem::Kind::jpeg) jpegs.push_back(std::move(it->jpeg));
    std::vector<DeviceJpegDecoder::Decoded> decoded;
    if (!jpegs.empty()) decoded = jpeg_.decode(jpegs, s);
    size_t upload = 0;
    for (DeviceItem* it : items) {
      if (it->kind == DeviceItem::Kind::image) upload += align256(it->image.data.size());
      if (it->kind == DeviceItem::Kind::dicom) {
        const ImageInfo info = it->dicom->info();
        upload += align256(size_t(info.width) * info.height * 2);
      }
    }
    auto* host = static_cast<uint8_t*>(staging_.reserve(upload + 256));
    auto* dev = static_cast<uint8_t*>(uploaded_.reserve(upload + 256));
    std::vector<DeviceImage> images;
    std::vector<AugmentParams> params;
    size_t at = 0, next_jpeg = 0;
    for (DeviceItem* it : items) {
      params.push_back(it->params);
      if (it->kind == DeviceItem::Kind::jpeg) {
        const auto& d = decoded[next_jpeg++];
        images.push_back(DeviceImage{d.pixels, d.width, d.height, d.channels, 8});
      } else if (it->kind == DeviceItem::Kind::dicom) {
        // Windowed straight into the batch's upload area.
        const ImageInfo info = it->dicom->info();
        const size_t bytes = size_t(info.width) * info.height * 2;
        dicom_.window(*it->dicom, o_.window, reinterpret_cast<uint16_t*>(dev + at), s);
        images.push_back(DeviceImage{dev + at, info.width, info.height, 1, 16});
        at += align256(bytes);
      } else {
        const Image& im = it->image;
        std::memcpy(host + at, im.data.data(), im.data.size());
        cuda::copy_to_device(dev + at, host + at, im.data.size(), s);
        images.push_back(DeviceImage{dev + at, im.width, im.height, im.channels, im.bits});
        at += align256(im.data.size());
      }
    }
    augment_.run(images, params, out, s);
    s.synchronize();
  }

  std::string describe() const override {
    std::ostringstream o;
    o << "decode " << placement_name(o_.decode)
      << (o_.decode == Placement::gpu ? " (JPEG: mixed, DICOM: windowing; PNG on the CPU)" : "")
      << ", augment " << placement_name(o_.augment) << " on cuda:" << cuda::current_device();
    return o.str();
  }

 private:
  PipelineOptions o_;
  std::mutex mu_;
  DeviceJpegDecoder jpeg_;
  DeviceDicomWindow dicom_;
  DeviceAugment augment_;
  GrowingBuffer staging_{true}, uploaded_{false};
};

}  // namespace

std::unique_ptr<DeviceStage> make_device_stage(const PipelineOptions& o, int channels) {
  if (!cuda::device_chosen()) {
    COHORT_THROW("--decode " << placement_name(o.decode) << " --augment-on "
                             << placement_name(o.augment) << ": "
                             << (cuda::device_count() == 0
                                     ? cuda::unavailable_reason()
                                     : std::string("no CUDA device chosen for this process")));
  }
  return std::make_unique<CudaStage>(o, channels);
}

}  // namespace cohort::data
