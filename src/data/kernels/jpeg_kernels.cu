// The mixed JPEG decoder's kernels (see jpeg_kernels.h): a thread per 8x8 block for the IDCT,
// a thread per pixel for upsampling and colour conversion; the maths is jpeg_math.h's.
#include <cuda_runtime.h>

#include "cohort/core/cuda_launch.h"
#include "cohort/core/error.h"
#include "jpeg_kernels.h"
#include "jpeg_math.h"

namespace cohort::data::kernels {

namespace {

__global__ void idct_kernel(const DeviceJpegImage* images, int count, const int64_t* block_start,
                            int64_t blocks) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  // The (image, component) pair whose range holds b: a binary search of the prefix sums.
  int lo = 0, hi = count * 3;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (block_start[mid] <= b)
      lo = mid;
    else
      hi = mid;
  }
  const DeviceJpegImage& im = images[lo / 3];
  const int c = lo % 3;
  if (c >= im.components) return;
  const DeviceJpegComponent& k = im.comp[c];
  const int64_t i = b - block_start[lo];
  const int bx = int(i % k.blocks_w), by = int(i / k.blocks_w);
  const int stride = k.blocks_w * 8;
  idct_block(k.coef + i * 64, k.quant, k.plane + int64_t(by) * 8 * stride + bx * 8, stride);
}

__global__ void color_kernel(const DeviceJpegImage* images, int max_w) {
  const DeviceJpegImage& im = images[blockIdx.z];
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x >= im.width || y >= im.height || x >= max_w) return;
  const DeviceJpegComponent& l = im.comp[0];
  const Plane luma{l.plane, l.width, l.height, l.blocks_w * 8};
  if (im.components == 1) {
    im.out[int64_t(y) * im.width + x] = static_cast<uint8_t>(luma.at(x, y));
    return;
  }
  const DeviceJpegComponent &b = im.comp[1], &r = im.comp[2];
  const Plane cb{b.plane, b.width, b.height, b.blocks_w * 8};
  const Plane cr{r.plane, r.width, r.height, r.blocks_w * 8};
  ycc_to_rgb(luma.at(x, y), upsample(cb, x, y, b.h, b.v), upsample(cr, x, y, r.h, r.v),
             im.out + (int64_t(y) * im.width + x) * 3);
}

}  // namespace

void launch_jpeg_idct(const DeviceJpegImage* images, int count, const int64_t* block_start,
                      int64_t blocks, void* stream) {
  if (blocks == 0) return;
  constexpr int kThreads = 128;
  const int64_t grid = (blocks + kThreads - 1) / kThreads;
  idct_kernel<<<static_cast<unsigned>(grid), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      images, count, block_start, blocks);
  cuda::check_launch("jpeg_idct");
}

void launch_jpeg_color(const DeviceJpegImage* images, int count, int max_w, int max_h,
                       void* stream) {
  if (count == 0 || max_w == 0 || max_h == 0) return;
  constexpr int kThreads = 128;
  const dim3 grid((max_w + kThreads - 1) / kThreads, max_h, count);
  color_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(images, max_w);
  cuda::check_launch("jpeg_color");
}

}  // namespace cohort::data::kernels
