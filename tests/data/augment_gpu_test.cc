// The pipeline's operators on a GPU (src/data/augment_device.h) against the CPU operators run as
// the CPU pipeline runs them: crop resampling, flips, rotation, brightness and contrast, channel
// repetition for gray and normalisation into f32 NHWC, per sample, within 1e-3 (the sums' order
// and fused multiply-adds differ in the last bits); bf16 output within its precision. Label gpu.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../../src/data/augment_device.h"
#include "cohort/core/cuda.h"
#include "cohort/core/half.h"
#include "cohort/data/ops.h"
#include "testing/gpu.h"

namespace {

using namespace cohort::data;
namespace cuda = cohort::cuda;

Image source(int w, int h, int channels, int bits) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  img.bits = bits;
  img.data.resize(img.row_bytes() * h);
  const double top = bits == 16 ? 60000 : 250;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        const double v = top * (0.5 + 0.45 * std::sin(0.05 * x + 0.08 * y + c));
        const size_t i = (size_t(y) * w + x) * channels + c;
        if (bits == 8) {
          img.data[i] = uint8_t(v);
        } else {
          const uint16_t u = uint16_t(v);
          std::memcpy(&img.data[2 * i], &u, 2);
        }
      }
  return img;
}

// The CPU pipeline's steps for one sample (src/data/pipeline.cc), into f32 NHWC.
std::vector<float> cpu_sample(const Image& img, const AugmentParams& p, int S, int C,
                              const std::vector<float>& mean, const std::vector<float>& sd) {
  const size_t plane = size_t(S) * S;
  std::vector<float> planes(plane * C), scratch;
  resize_crop(img, p.box, S, S, planes.data());
  const int own = img.channels;
  if (p.hflip) flip_horizontal(planes.data(), own, S, S);
  if (p.vflip) flip_vertical(planes.data(), own, S, S);
  if (p.degrees != 0) rotate(planes.data(), own, S, S, p.degrees, scratch);
  if (p.jitter) brightness_contrast(planes.data(), own, S, S, p.brightness, p.contrast);
  for (int c = own; c < C; ++c) std::memcpy(&planes[c * plane], planes.data(), plane * 4);
  const float inv = 1.f / (img.bits == 16 ? 65535.f : 255.f);
  std::vector<float> out(plane * C);
  for (int c = 0; c < C; ++c)
    for (size_t i = 0; i < plane; ++i)
      out[i * C + c] = planes[c * plane + i] * (inv / sd[c]) + (-mean[c] / sd[c]);
  return out;
}

TEST(AugmentGpu, TheBatchIsTheCpuPipelinesWithinTolerance) {
  COHORT_REQUIRE_GPU();
  const int S = 96, C = 3;
  const std::vector<float> mean = {0.485f, 0.456f, 0.406f}, sd = {0.229f, 0.224f, 0.225f};
  const std::vector<Image> images = {source(300, 200, 3, 8), source(256, 256, 1, 16),
                                     source(500, 375, 3, 8), source(64, 48, 3, 8)};
  std::vector<AugmentParams> params(4);
  params[0].box = {20.5, 10, 200, 150};
  params[0].hflip = true;
  params[1].box = {0, 0, 256, 256};
  params[1].degrees = 12.5;
  params[1].jitter = true;
  params[1].brightness = 0.1f * 65535;
  params[1].contrast = 1.2f;
  params[2].box = {100, 50, 224, 224};
  params[2].vflip = true;
  params[2].degrees = -7;
  params[2].jitter = true;
  params[2].brightness = -0.05f * 255;
  params[2].contrast = 0.8f;
  params[3].box = {5, 3, 40, 30};  // upscaled
  std::vector<void*> on_device;
  std::vector<DeviceImage> dev;
  for (const Image& im : images) {
    void* p = cuda::device_malloc(im.data.size());
    cuda::copy_to_device(p, im.data.data(), im.data.size(), cuda::Stream::compute());
    on_device.push_back(p);
    dev.push_back(DeviceImage{p, im.width, im.height, im.channels, im.bits});
  }
  for (auto [type, tol] :
       {std::pair{kernels::BatchType::f32, 1e-3}, {kernels::BatchType::bf16, 2e-2}}) {
    DeviceAugment aug(S, C, mean, sd, type, true);
    const size_t elems = size_t(images.size()) * C * S * S;
    const size_t esize = type == kernels::BatchType::f32 ? 4 : 2;
    void* out = cuda::device_malloc(elems * esize);
    const cuda::Stream s = cuda::Stream::compute();
    aug.run(dev, params, out, s);
    std::vector<uint8_t> got(elems * esize);
    cuda::copy_to_host(got.data(), out, got.size(), s);
    s.synchronize();
    cuda::device_free(out);
    for (size_t n = 0; n < images.size(); ++n) {
      const auto want = cpu_sample(images[n], params[n], S, C, mean, sd);
      for (size_t i = 0; i < want.size(); ++i) {
        const size_t at = n * want.size() + i;
        float v;
        if (esize == 4) {
          std::memcpy(&v, &got[4 * at], 4);
        } else {
          uint16_t h;
          std::memcpy(&h, &got[2 * at], 2);
          v = cohort::bf16_to_f32(h);
        }
        ASSERT_NEAR(v, want[i], tol * std::max(1.0f, std::abs(want[i])))
            << "sample " << n << " element " << i << (esize == 4 ? " f32" : " bf16");
      }
    }
  }
  for (void* p : on_device) cuda::device_free(p);
}

}  // namespace
