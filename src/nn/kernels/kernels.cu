// nn's CUDA kernels (see kernels.h): thin loops over the element maths of math.h, which the host
// tests check against the CPU engine.
#include <cuda_runtime.h>

#include "cohort/core/cuda_launch.h"
#include "cohort/core/error.h"
#include "kernels.h"

namespace cohort::nn::kernels {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// The elements [lo, hi) of range *r that chunk b covers.
__device__ void chunk_bounds(const DeviceRanges& d, int64_t b, int* r, int64_t* lo, int64_t* hi) {
  *r = range_of_chunk(d.first_chunk, d.ranges, b);
  *lo = (b - d.first_chunk[*r]) * kChunk;
  const int64_t end = *lo + kChunk;
  *hi = end < d.n[*r] ? end : d.n[*r];
}

__global__ void sgd_kernel(DeviceRanges d, SgdStep s) {
  for (int64_t b = blockIdx.x; b < d.chunks; b += gridDim.x) {
    int r;
    int64_t lo, hi;
    chunk_bounds(d, b, &r, &lo, &hi);
    float* w = d.w[r];
    const float* g = d.g[r];
    float* m = s.momentum != 0.0f ? d.state0[r] : nullptr;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      float unused = 0;
      sgd_update(w[i], g[i], m ? m[i] : unused, s);
    }
  }
}

__global__ void adamw_kernel(DeviceRanges d, AdamWStep s) {
  for (int64_t b = blockIdx.x; b < d.chunks; b += gridDim.x) {
    int r;
    int64_t lo, hi;
    chunk_bounds(d, b, &r, &lo, &hi);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      adamw_update(d.w[r][i], d.g[r][i], d.state0[r][i], d.state1[r][i], s);
    }
  }
}

__global__ void lars_kernel(DeviceRanges d, const float* trust, const float* weight_decay, float lr,
                            float momentum) {
  for (int64_t b = blockIdx.x; b < d.chunks; b += gridDim.x) {
    int r;
    int64_t lo, hi;
    chunk_bounds(d, b, &r, &lo, &hi);
    const float t = trust[r];
    const float wd = weight_decay[r];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      lars_update(d.w[r][i], d.g[r][i], d.state0[r][i], lr, momentum, t, wd);
    }
  }
}

// One thread per row: rows are few (a batch) and k small (the findings or classes).
__global__ void softmax_xent_kernel(const float* z, const int32_t* labels, int rows, int k,
                                    float smoothing, float* prob, double* row_loss) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  row_loss[i] = softmax_xent_row(z + static_cast<int64_t>(i) * k, k, labels[i], smoothing,
                                 prob + static_cast<int64_t>(i) * k);
}

__global__ void softmax_xent_grad_kernel(const float* prob, const int32_t* labels, int rows, int k,
                                         float smoothing, float scale, float* dz) {
  const int64_t n = static_cast<int64_t>(rows) * k;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / k;
    dz[e] = softmax_xent_grad(prob[e], e % k == labels[i], smoothing, k, scale);
  }
}

__global__ void bce_kernel(const float* x, const float* t, int64_t m, double* loss) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    loss[e] = bce_with_logits_value(x[e], t[e]);
  }
}

__global__ void bce_grad_kernel(const float* x, const float* t, int64_t m, float scale, float* dx) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dx[e] = bce_with_logits_grad(x[e], t[e], scale);
  }
}

__global__ void bn_apply_kernel(const float* x, const float* residual, int64_t m, int c,
                                const float* mean, const float* invstd, const float* gamma,
                                const float* beta, bool fuse_relu, float* y) {
  const int64_t n = m * c;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>(e % c);
    float v = bn_apply(x[e], mean[ch], invstd[ch], gamma[ch], beta[ch]);
    if (residual) v += residual[e];
    y[e] = fuse_relu ? relu(v) : v;
  }
}

__global__ void overflow_kernel(const float* g, int64_t n, unsigned int* overflow) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (grad_overflows(g[e])) atomicAdd(overflow, 1u);
  }
}

__global__ void unscale_kernel(float* g, int64_t n, float inv_scale, const unsigned int* overflow) {
  if (*overflow > 0) return;  // the step is skipped: the gradients are thrown away
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    g[e] = unscale(g[e], inv_scale);
  }
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

int chunk_blocks(const DeviceRanges& r) {
  return static_cast<int>(r.chunks < 65535 * 16 ? (r.chunks > 0 ? r.chunks : 1) : 65535 * 16);
}

}  // namespace

void launch_sgd(const DeviceRanges& r, const SgdStep& s, void* stream) {
  sgd_kernel<<<chunk_blocks(r), kThreads, 0, as_stream(stream)>>>(r, s);
  cuda::check_launch("sgd");
}

void launch_adamw(const DeviceRanges& r, const AdamWStep& s, void* stream) {
  adamw_kernel<<<chunk_blocks(r), kThreads, 0, as_stream(stream)>>>(r, s);
  cuda::check_launch("adamw");
}

void launch_lars(const DeviceRanges& r, const float* trust, const float* weight_decay, float lr,
                 float momentum, void* stream) {
  lars_kernel<<<chunk_blocks(r), kThreads, 0, as_stream(stream)>>>(r, trust, weight_decay, lr,
                                                                   momentum);
  cuda::check_launch("lars");
}

void launch_softmax_xent(const float* z, const int32_t* labels, int rows, int k, float smoothing,
                         float* prob, double* row_loss, void* stream) {
  softmax_xent_kernel<<<blocks_for(rows), kThreads, 0, as_stream(stream)>>>(
      z, labels, rows, k, smoothing, prob, row_loss);
  cuda::check_launch("softmax_xent");
}

void launch_softmax_xent_grad(const float* prob, const int32_t* labels, int rows, int k,
                              float smoothing, float scale, float* dz, void* stream) {
  softmax_xent_grad_kernel<<<blocks_for(static_cast<int64_t>(rows) * k), kThreads, 0,
                             as_stream(stream)>>>(prob, labels, rows, k, smoothing, scale, dz);
  cuda::check_launch("softmax_xent_grad");
}

void launch_bce_with_logits(const float* x, const float* t, int64_t m, double* loss, void* stream) {
  bce_kernel<<<blocks_for(m), kThreads, 0, as_stream(stream)>>>(x, t, m, loss);
  cuda::check_launch("bce_with_logits");
}

void launch_bce_with_logits_grad(const float* x, const float* t, int64_t m, float scale, float* dx,
                                 void* stream) {
  bce_grad_kernel<<<blocks_for(m), kThreads, 0, as_stream(stream)>>>(x, t, m, scale, dx);
  cuda::check_launch("bce_with_logits_grad");
}

void launch_bn_apply(const float* x, const float* residual, int64_t m, int c, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, bool relu,
                     float* y, void* stream) {
  bn_apply_kernel<<<blocks_for(m * c), kThreads, 0, as_stream(stream)>>>(
      x, residual, m, c, mean, invstd, gamma, beta, relu, y);
  cuda::check_launch("bn_apply");
}

void launch_unscale(float* g, int64_t n, float inv_scale, unsigned int* overflow, void* stream) {
  overflow_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, n, overflow);
  cuda::check_launch("overflow");
  unscale_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, n, inv_scale, overflow);
  cuda::check_launch("unscale");
}

}  // namespace cohort::nn::kernels
