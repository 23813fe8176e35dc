// Launchers of nn's CUDA kernels (built with COHORT_CUDA; the maths they run is math.h). Every
// pointer is device memory; `stream` is a cudaStream_t, passed as void* so that this header
// compiles without CUDA's. A launcher returns once the kernel is queued on the stream and
// throws cohort::Error, naming the kernel and CUDA's message, when the launch fails.
#pragma once

#include <cstdint>

#include "math.h"

namespace cohort::nn::kernels {

// The optimiser's view of the flat buffers, as device arrays of one entry per range: one launch
// updates them all (one block per chunk of kChunk elements; first_chunk has ranges + 1 entries,
// the last the total).
inline constexpr int64_t kChunk = 16384;
struct DeviceRanges {
  const int64_t* first_chunk = nullptr;
  const int64_t* n = nullptr;
  float* const* w = nullptr;
  const float* const* g = nullptr;
  float* const* state0 = nullptr;  // momentum, or Adam's first moment
  float* const* state1 = nullptr;  // Adam's second moment
  int ranges = 0;
  int64_t chunks = 0;
};

void launch_sgd(const DeviceRanges& r, const SgdStep& s, void* stream);
void launch_adamw(const DeviceRanges& r, const AdamWStep& s, void* stream);
// trust and weight_decay: one value per range (the caller cuts ranges at parameter boundaries
// for LARS; norms and biases take trust 1 and no decay).
void launch_lars(const DeviceRanges& r, const float* trust, const float* weight_decay, float lr,
                 float momentum, void* stream);

// Softmax cross-entropy over [rows, k] logits: each row's loss into row_loss, its
// probabilities into prob; then the logits' gradient from prob, scaled by `scale`.
void launch_softmax_xent(const float* z, const int32_t* labels, int rows, int k, float smoothing,
                         float* prob, double* row_loss, void* stream);
void launch_softmax_xent_grad(const float* prob, const int32_t* labels, int rows, int k,
                              float smoothing, float scale, float* dz, void* stream);
// Multi-label BCE on m logits: each element's loss, and the gradient scaled by `scale`.
void launch_bce_with_logits(const float* x, const float* t, int64_t m, double* loss, void* stream);
void launch_bce_with_logits_grad(const float* x, const float* t, int64_t m, float scale, float* dx,
                                 void* stream);

// Batch norm applied to channels-last activations ([m, c]), with the residual added and the
// ReLU that follows fused where given: y = relu(bn(x) + residual).
void launch_bn_apply(const float* x, const float* residual, int64_t m, int c, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, bool relu,
                     float* y, void* stream);

// The loss scaler's pass over the gradients: counts overflowing elements into *overflow (one
// integer the host reads: the one synchronisation per step) and, where none overflowed yet,
// unscales in place. The host skips the step when *overflow > 0.
void launch_unscale(float* g, int64_t n, float inv_scale, unsigned int* overflow, void* stream);

}  // namespace cohort::nn::kernels
