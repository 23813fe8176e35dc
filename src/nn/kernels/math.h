// The arithmetic of nn's GPU kernels, one element (or one row) at a time, as functions that compile
// for the host and the device (`__host__ __device__` under nvcc, plain inline functions
// elsewhere). The kernels in this folder call them and nothing else for their maths, so that
// tests/nn/kernel_math_test.cc checks on the host, against the CPU engine, what the GPU computes:
// the optimisers (torch.optim's SGD, AdamW; LARS), the losses, the normalisation and elementwise
// maths, the loss scaler's check and gradient clipping, and how a multi-tensor launch walks the
// flat buffers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cohort/core/host_device.h"

namespace cohort::nn::kernels {

// ------------------------------------------------------------------ optimisers

// torch.optim.SGD: weight decay as L2 on the gradient, momentum buffer, optional Nesterov.
struct SgdStep {
  float lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
};
COHORT_HD void sgd_update(float& w, float g, float& buf, const SgdStep& s) {
  const float d = g + s.weight_decay * w;
  if (s.momentum == 0.0f) {
    w -= s.lr * d;
    return;
  }
  buf = s.momentum * buf + d;
  w -= s.lr * (s.nesterov ? d + s.momentum * buf : buf);
}

// torch.optim.AdamW: decoupled decay, then Adam with bias corrections c1 = 1 / (1 - b1^t) and
// c2 = 1 / sqrt(1 - b2^t), computed once per step on the host (adamw_step).
struct AdamWStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float c1 = 1, c2 = 1;
};
inline AdamWStep adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                            int64_t step) {
  AdamWStep s{lr, beta1, beta2, eps, weight_decay, 1, 1};
  s.c1 = 1.0f / (1.0f - std::pow(beta1, static_cast<float>(step)));
  s.c2 = 1.0f / std::sqrt(1.0f - std::pow(beta2, static_cast<float>(step)));
  return s;
}
COHORT_HD void adamw_update(float& w, float g, float& m, float& v, const AdamWStep& s) {
  w -= s.lr * s.weight_decay * w;
  m = s.beta1 * m + (1 - s.beta1) * g;
  v = s.beta2 * v + (1 - s.beta2) * g * g;
  w -= s.lr * (m * s.c1) / (sqrtf(v) * s.c2 + s.eps);
}

// LARS (You et al. 2017): a decayed parameter's step is scaled by eta |w| / (|g| + wd |w|), from
// its norms over the whole parameter (summed first, across ranks when it is sharded); norms and
// biases (decay false) take plain momentum SGD.
COHORT_HD float lars_trust(double w_norm, double g_norm, float eta, float weight_decay,
                           bool decay) {
  if (!decay || !(w_norm > 0) || !(g_norm > 0)) return 1.0f;
  return static_cast<float>(eta * w_norm / (g_norm + weight_decay * w_norm));
}
COHORT_HD void lars_update(float& w, float g, float& buf, float lr, float momentum, float trust,
                           float weight_decay) {
  buf = momentum * buf + trust * (g + weight_decay * w);
  w -= lr * buf;
}

// ------------------------------------------------------------------ multi-tensor launches

// One launch updates every range of the flat buffers: the ranges are cut into chunks of
// `chunk` elements, a block takes one chunk, and block b finds its range by the chunks' prefix
// sums (first_chunk[i]: the first chunk of range i; first_chunk[ranges] = total).
COHORT_HD int64_t chunks_of(int64_t n, int64_t chunk) {
  return (n + chunk - 1) / chunk;
}
// The range that holds chunk b: a binary search over first_chunk[0..ranges].
COHORT_HD int range_of_chunk(const int64_t* first_chunk, int ranges, int64_t b) {
  int lo = 0, hi = ranges - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_chunk[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ------------------------------------------------------------------ losses

// Softmax cross-entropy with label smoothing s over one row of k logits: the row's loss
// (1 - s) (lse - z_y) + s mean_j (lse - z_j), with the probabilities written to prob. As the
// CPU engine: the max and the sum of exponentials in double.
COHORT_HD double softmax_xent_row(const float* z, int k, int label, float smoothing, float* prob) {
  float mx = z[0];
  for (int j = 1; j < k; ++j) mx = z[j] > mx ? z[j] : mx;
  double se = 0;
  for (int j = 0; j < k; ++j) se += exp(static_cast<double>(z[j] - mx));
  const double lse = mx + log(se);
  double smooth = 0;
  for (int j = 0; j < k; ++j) {
    prob[j] = static_cast<float>(exp(z[j] - lse));
    smooth += lse - z[j];
  }
  return (1.0 - smoothing) * (lse - z[label]) + smoothing * smooth / static_cast<double>(k);
}
// d loss / d z_j for probability p, with `scale` = the loss's gradient / rows.
COHORT_HD float softmax_xent_grad(float p, bool is_label, float smoothing, int k, float scale) {
  return scale * (p - smoothing / static_cast<float>(k) - (is_label ? 1.0f - smoothing : 0.0f));
}

// Binary cross-entropy on a logit x with target t (multi-label findings), in the stable form
// max(x, 0) - x t + log(1 + exp(-|x|)); its gradient is sigmoid(x) - t.
COHORT_HD double bce_with_logits_value(double x, double t) {
  return (x > 0 ? x : 0.0) - x * t + log1p(exp(-fabs(x)));
}
COHORT_HD float bce_with_logits_grad(float x, float t, float scale) {
  return scale * (1.0f / (1.0f + expf(-x)) - t);
}

// ------------------------------------------------------------------ normalisation, elementwise

COHORT_HD float bn_invstd(double var, float eps) {
  return static_cast<float>(1.0 / sqrt(var + eps));
}
// y = gamma (x - mean) invstd + beta, with the ReLU that follows fused where asked, and the
// residual added before it (a residual block's tail: relu(bn(x) + skip)).
COHORT_HD float bn_apply(float x, float mean, float invstd, float gamma, float beta) {
  return gamma * (x - mean) * invstd + beta;
}
COHORT_HD float relu(float x) {
  return x > 0.0f ? x : 0.0f;
}
COHORT_HD float relu_grad(float dy, float y) {
  return y > 0.0f ? dy : 0.0f;
}
// Training-mode batch norm backward for one element, from the channel's sums over its m
// elements: sum_dy = sum dy, sum_dy_xhat = sum dy * xhat.
COHORT_HD float bn_backward_dx(float dy, float xhat, float gamma, float invstd, double sum_dy,
                               double sum_dy_xhat, double m) {
  return static_cast<float>(gamma * invstd * (dy - sum_dy / m - xhat * sum_dy_xhat / m));
}
// Welford's update of a running (count, mean, M2) with one value, and the merge of two partial
// results: how a block's threads and then the blocks combine a channel's statistics.
struct Moments {
  double count = 0, mean = 0, m2 = 0;
};
COHORT_HD void moments_add(Moments& a, double x) {
  a.count += 1;
  const double d = x - a.mean;
  a.mean += d / a.count;
  a.m2 += d * (x - a.mean);
}
COHORT_HD Moments moments_merge(const Moments& a, const Moments& b) {
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  Moments r;
  r.count = a.count + b.count;
  const double d = b.mean - a.mean;
  r.mean = a.mean + d * b.count / r.count;
  r.m2 = a.m2 + b.m2 + d * d * a.count * b.count / r.count;
  return r;
}

// ------------------------------------------------------------------ loss scaler, clipping

// f16 loss scaling: a gradient beyond f16's largest finite value (65504), inf or NaN is an
// overflow; otherwise it is divided back by the scale.
COHORT_HD bool grad_overflows(float g) {
  return !(fabsf(g) <= 65504.0f);  // NaN compares false
}
COHORT_HD float unscale(float g, float inv_scale) {
  return g * inv_scale;
}
// The factor clip_grad_norm applies: max_norm / (norm + 1e-6) where the norm exceeds max_norm.
COHORT_HD float clip_coefficient(double total_norm, double max_norm) {
  return total_norm > max_norm ? static_cast<float>(max_norm / (total_norm + 1e-6)) : 1.0f;
}

}  // namespace cohort::nn::kernels
