// DeviceAugment (see augment_device.h): the samples' taps and parameters packed into one staged
// copy, then four launches over the whole batch.
#include "augment_device.h"

#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"
#include "taps.h"

namespace cohort::data {

DeviceAugment::DeviceAugment(int size, int channels, std::vector<float> mean,
                             std::vector<float> std, kernels::BatchType type, bool nhwc)
    : size_(size),
      channels_(channels),
      mean_(std::move(mean)),
      std_(std::move(std)),
      type_(type),
      nhwc_(nhwc) {
  COHORT_CHECK(size > 0 && channels > 0 && channels <= kernels::DeviceSample::kMaxChannels &&
                   !mean_.empty() && !std_.empty(),
               "DeviceAugment: size " << size << ", " << channels << " channels, " << mean_.size()
                                      << " means, " << std_.size() << " stds");
}

void DeviceAugment::run(const std::vector<DeviceImage>& images,
                        const std::vector<AugmentParams>& params, void* out,
                        const cuda::Stream& s) {
  COHORT_CHECK(images.size() == params.size(), "DeviceAugment: " << images.size() << " images and "
                                                                 << params.size()
                                                                 << " parameter sets");
  const int n = static_cast<int>(images.size());
  const int S = size_, C = channels_;
  // Taps on the host, as the CPU resampler makes them.
  std::vector<Taps> tx(n), ty(n);
  size_t taps_bytes = 0;
  for (int i = 0; i < n; ++i) {
    const DeviceImage& im = images[i];
    COHORT_CHECK(im.bits == 8 || im.bits == 16, "DeviceAugment: " << im.bits << "-bit pixels");
    COHORT_CHECK(im.channels == 1 || im.channels == C,
                 "DeviceAugment: an image of " << im.channels << " channels in a batch of " << C);
    tx[i] = make_taps(params[i].box.x, params[i].box.w, im.width, S);
    ty[i] = make_taps(params[i].box.y, params[i].box.h, im.height, S);
    for (const Taps* t : {&tx[i], &ty[i]})
      taps_bytes += align256(t->first.size() * 4) * 2 + align256(t->weight.size() * 4);
  }
  const size_t desc_bytes = align256(sizeof(kernels::DeviceSample) * n);
  const size_t staged = desc_bytes + taps_bytes;
  // The previous batch's copy out of the staging buffer must be done before it is written.
  s.synchronize();
  auto* host = static_cast<uint8_t*>(staging_.reserve(staged));
  auto* dev = static_cast<uint8_t*>(params_.reserve(staged));
  const size_t plane_bytes = sizeof(float) * size_t(n) * C * S * S;
  auto* planes = static_cast<float*>(planes_.reserve(plane_bytes));
  bool any_rotation = false, any_jitter = false;
  for (const AugmentParams& p : params) {
    any_rotation = any_rotation || p.degrees != 0;
    any_jitter = any_jitter || p.jitter;
  }
  auto* turned = any_rotation ? static_cast<float*>(turned_.reserve(plane_bytes)) : planes;
  auto* means = static_cast<float*>(means_.reserve(sizeof(float) * size_t(n) * C + 4));

  size_t at = desc_bytes;
  auto put = [&](const void* src, size_t bytes) {
    std::memcpy(host + at, src, bytes);
    const uint8_t* d = dev + at;
    at += align256(bytes);
    return d;
  };
  std::vector<kernels::DeviceSample> desc(n);
  for (int i = 0; i < n; ++i) {
    kernels::DeviceSample& d = desc[i];
    const DeviceImage& im = images[i];
    const AugmentParams& p = params[i];
    d.src = im.pixels;
    d.width = im.width;
    d.height = im.height;
    d.channels = im.channels;
    d.bits = im.bits;
    for (auto [t, v] : {std::pair{&tx[i], &d.tx}, std::pair{&ty[i], &d.ty}}) {
      v->first = reinterpret_cast<const int*>(put(t->first.data(), t->first.size() * 4));
      v->count = reinterpret_cast<const int*>(put(t->count.data(), t->count.size() * 4));
      v->weight = reinterpret_cast<const float*>(put(t->weight.data(), t->weight.size() * 4));
      v->stride = t->stride;
    }
    d.hflip = p.hflip;
    d.vflip = p.vflip;
    d.rotate = p.degrees != 0;
    const double a = p.degrees * 3.14159265358979323846 / 180.0;
    d.rot_cos = std::cos(a);
    d.rot_sin = std::sin(a);
    d.jitter = p.jitter;
    d.brightness = p.brightness;
    d.contrast = p.contrast;
    // (x / max - mean) / std = x * a + b, with max the sample's range, as the CPU pipeline has it.
    const float inv = 1.f / (im.bits == 16 ? 65535.f : 255.f);
    for (int c = 0; c < C; ++c) {
      const float m = mean_[std::min<size_t>(c, mean_.size() - 1)];
      const float sd = std_[std::min<size_t>(c, std_.size() - 1)];
      d.a[c] = type_ == kernels::BatchType::u8 ? inv * 255.f : inv / sd;
      d.b[c] = type_ == kernels::BatchType::u8 ? 0.f : -m / sd;
    }
  }
  std::memcpy(host, desc.data(), sizeof(kernels::DeviceSample) * n);
  cuda::copy_to_device(dev, host, at, s);
  const auto* samples = reinterpret_cast<const kernels::DeviceSample*>(dev);
  kernels::launch_resample(samples, n, S, C, planes, s.handle());
  if (any_rotation) kernels::launch_rotate(samples, n, S, C, planes, turned, s.handle());
  if (any_jitter) kernels::launch_plane_means(samples, n, S, C, turned, means, s.handle());
  kernels::launch_finish(samples, n, S, C, turned, means, type_, nhwc_, out, s.handle());
  s.synchronize();
}

}  // namespace cohort::data
