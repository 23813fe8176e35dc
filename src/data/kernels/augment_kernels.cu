// The pipeline's device operators (see augment_kernels.h).
#include <cuda_runtime.h>

#include "augment_kernels.h"
#include "cohort/core/cuda_launch.h"
#include "cohort/core/error.h"
#include "cohort/core/half.h"

namespace cohort::data::kernels {

namespace {

constexpr int kThreads = 256;

// grid: (S*S / kThreads, C, count)
__global__ void resample_kernel(const DeviceSample* samples, int S, int C, float* planes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S * S) return;
  const int c = blockIdx.y, n = blockIdx.z;
  const DeviceSample& s = samples[n];
  const int x = flipped(i % S, S, s.hflip), y = flipped(i / S, S, s.vflip);
  const int sc = c < s.channels ? c : 0;
  float v;
  if (s.bits == 8) {
    const auto* p = static_cast<const uint8_t*>(s.src);
    auto at = [&](int xx, int yy, int cc) {
      return float(p[(int64_t(yy) * s.width + xx) * s.channels + cc]);
    };
    v = resample_point(at, s.tx, s.ty, x, y, sc);
  } else {
    const auto* p = static_cast<const uint16_t*>(s.src);
    auto at = [&](int xx, int yy, int cc) {
      return float(p[(int64_t(yy) * s.width + xx) * s.channels + cc]);
    };
    v = resample_point(at, s.tx, s.ty, x, y, sc);
  }
  planes[((int64_t(n) * C + c) * S) * S + i] = v;
}

__global__ void rotate_kernel(const DeviceSample* samples, int S, int C, const float* in,
                              float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S * S) return;
  const int c = blockIdx.y, n = blockIdx.z;
  const DeviceSample& s = samples[n];
  const int64_t base = (int64_t(n) * C + c) * S * S;
  out[base + i] =
      s.rotate ? rotate_point(in + base, S, S, i % S, i / S, s.rot_cos, s.rot_sin) : in[base + i];
}

// One block per plane: a sum in double, then the mean.
__global__ void means_kernel(const DeviceSample* samples, int S, int C, const float* planes,
                             float* means) {
  const int c = blockIdx.x, n = blockIdx.y;
  if (!samples[n].jitter) return;
  const float* p = planes + (int64_t(n) * C + c) * S * S;
  __shared__ double part[kThreads];
  double acc = 0;
  for (int i = threadIdx.x; i < S * S; i += blockDim.x) acc += p[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) means[n * C + c] = static_cast<float>(part[0] / double(S * S));
}

__global__ void finish_kernel(const DeviceSample* samples, int S, int C, const float* planes,
                              const float* means, BatchType type, bool nhwc, void* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S * S) return;
  const int c = blockIdx.y, n = blockIdx.z;
  const DeviceSample& s = samples[n];
  // A sample's own channels are augmented; the batch's extra ones repeat its first, augmented.
  const int sc = c < s.channels ? c : 0;
  float v = planes[((int64_t(n) * C + sc) * S) * S + i];
  if (s.jitter) v = contrast_point(v, means[n * C + sc], s.contrast, s.brightness);
  const int64_t at = nhwc ? (int64_t(n) * S * S + i) * C + c : ((int64_t(n) * C + c) * S) * S + i;
  if (type == BatchType::f32) {
    static_cast<float*>(out)[at] = normalize_point(v, s.a[c], s.b[c]);
  } else if (type == BatchType::bf16) {
    static_cast<uint16_t*>(out)[at] = f32_to_bf16(normalize_point(v, s.a[c], s.b[c]));
  } else {
    static_cast<uint8_t*>(out)[at] = u8_point(v, s.a[c]);
  }
}

dim3 grid_for(int S, int C, int count) {
  return dim3((S * S + kThreads - 1) / kThreads, C, count);
}

}  // namespace

void launch_resample(const DeviceSample* samples, int count, int S, int C, float* planes,
                     void* stream) {
  if (count == 0) return;
  resample_kernel<<<grid_for(S, C, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      samples, S, C, planes);
  cuda::check_launch("resample");
}

void launch_rotate(const DeviceSample* samples, int count, int S, int C, const float* planes,
                   float* out, void* stream) {
  if (count == 0) return;
  rotate_kernel<<<grid_for(S, C, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      samples, S, C, planes, out);
  cuda::check_launch("rotate");
}

void launch_plane_means(const DeviceSample* samples, int count, int S, int C, const float* planes,
                        float* means, void* stream) {
  if (count == 0) return;
  means_kernel<<<dim3(C, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(samples, S, C,
                                                                                   planes, means);
  cuda::check_launch("plane_means");
}

void launch_finish(const DeviceSample* samples, int count, int S, int C, const float* planes,
                   const float* means, BatchType type, bool nhwc, void* out, void* stream) {
  if (count == 0) return;
  finish_kernel<<<grid_for(S, C, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      samples, S, C, planes, means, type, nhwc, out);
  cuda::check_launch("finish");
}

}  // namespace cohort::data::kernels
