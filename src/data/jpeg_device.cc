// DeviceJpegDecoder (see jpeg_device.h): packing, one copy, two launches.
#include "jpeg_device.h"

#include <algorithm>
#include <cstring>

#include "cohort/core/error.h"
#include "kernels/jpeg_kernels.h"

namespace cohort::data {

std::vector<DeviceJpegDecoder::Decoded> DeviceJpegDecoder::decode(
    const std::vector<JpegCoefficients>& batch, const cuda::Stream& s) {
  const int n = static_cast<int>(batch.size());
  // Sizes: the coefficients and quantisation tables (staged and copied), the planes and the
  // outputs (device only), and the descriptors with the block prefix sums (staged and copied).
  size_t coef_bytes = 0, plane_bytes = 0, out_bytes = 0;
  int max_w = 0, max_h = 0;
  for (const JpegCoefficients& c : batch) {
    COHORT_CHECK(c.components.size() == 1 || c.components.size() == 3,
                 "a JPEG of " << c.components.size() << " components on the device");
    for (const JpegComponent& k : c.components) {
      coef_bytes += align256(k.coef.size() * 2) + align256(64 * 2);
      plane_bytes += align256(size_t(k.blocks_w) * k.blocks_h * 64);
    }
    out_bytes += align256(size_t(c.width) * c.height * c.components.size());
    max_w = std::max(max_w, c.width);
    max_h = std::max(max_h, c.height);
  }
  const size_t meta_bytes =
      align256(sizeof(kernels::DeviceJpegImage) * n) + sizeof(int64_t) * (size_t(n) * 3 + 1);
  const size_t staged = coef_bytes + meta_bytes;
  // The previous batch's copy out of the staging buffer finished before that call returned.
  auto* host = static_cast<uint8_t*>(staging_.reserve(staged));
  auto* coef_dev = static_cast<uint8_t*>(coef_.reserve(staged));
  auto* plane_dev = static_cast<uint8_t*>(planes_.reserve(plane_bytes));
  auto* out_dev = static_cast<uint8_t*>(out_.reserve(out_bytes));

  std::vector<kernels::DeviceJpegImage> images(n);
  std::vector<int64_t> block_start(size_t(n) * 3 + 1, 0);
  std::vector<Decoded> decoded(n);
  size_t at = 0, plane_at = 0, out_at = 0;
  int64_t blocks = 0;
  for (int i = 0; i < n; ++i) {
    const JpegCoefficients& c = batch[i];
    kernels::DeviceJpegImage& im = images[i];
    im.components = static_cast<int>(c.components.size());
    im.width = c.width;
    im.height = c.height;
    im.out = out_dev + out_at;
    decoded[i] = Decoded{im.out, c.width, c.height, im.components};
    out_at += align256(size_t(c.width) * c.height * c.components.size());
    for (int k = 0; k < 3; ++k) {
      block_start[size_t(i) * 3 + k] = blocks;
      if (k >= im.components) continue;
      const JpegComponent& src = c.components[k];
      kernels::DeviceJpegComponent& d = im.comp[k];
      std::memcpy(host + at, src.coef.data(), src.coef.size() * 2);
      d.coef = reinterpret_cast<const int16_t*>(coef_dev + at);
      at += align256(src.coef.size() * 2);
      std::memcpy(host + at, src.quant.data(), 64 * 2);
      d.quant = reinterpret_cast<const uint16_t*>(coef_dev + at);
      at += align256(64 * 2);
      d.plane = plane_dev + plane_at;
      plane_at += align256(size_t(src.blocks_w) * src.blocks_h * 64);
      d.blocks_w = src.blocks_w;
      d.blocks_h = src.blocks_h;
      d.width = src.width;
      d.height = src.height;
      d.h = src.h;
      d.v = src.v;
      blocks += int64_t(src.blocks_w) * src.blocks_h;
    }
  }
  block_start.back() = blocks;
  std::memcpy(host + at, images.data(), sizeof(kernels::DeviceJpegImage) * n);
  const auto* images_dev = reinterpret_cast<const kernels::DeviceJpegImage*>(coef_dev + at);
  at += align256(sizeof(kernels::DeviceJpegImage) * n);
  std::memcpy(host + at, block_start.data(), sizeof(int64_t) * block_start.size());
  const auto* starts_dev = reinterpret_cast<const int64_t*>(coef_dev + at);
  at += sizeof(int64_t) * block_start.size();

  cuda::copy_to_device(coef_dev, host, at, s);
  kernels::launch_jpeg_idct(images_dev, n, starts_dev, blocks, s.handle());
  kernels::launch_jpeg_color(images_dev, n, max_w, max_h, s.handle());
  // The staging buffer is written again by the next call: wait for the copy out of it.
  s.synchronize();
  return decoded;
}

}  // namespace cohort::data
