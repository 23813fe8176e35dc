// The losses: softmax cross-entropy with label smoothing, and BCE with logits (multi-label
// findings).
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

// ---------------------------------------------------------------------------------------------
// Losses

Var cross_entropy(const Var& logits, const std::vector<int>& labels, float smoothing) {
  profile::Scope prof("loss");
  check_device("cross_entropy", logits->value);
  Tensor z = logits->value.contiguous();
  COHORT_CHECK(z.dim() == 2,
               "cross_entropy needs [N, K] logits, got " << tensor::shape_string(z.shape()));
  const int64_t n = z.size(0), k = z.size(1);
  COHORT_CHECK(static_cast<int64_t>(labels.size()) == n,
               "cross_entropy: " << labels.size() << " labels for " << n << " rows");
  COHORT_CHECK(smoothing >= 0.0f && smoothing < 1.0f, "label smoothing " << smoothing);
  Tensor prob = Tensor::empty({n, k});
  double total = 0;
  const float* zp = z.data<float>();
  float* pp = prob.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int y = labels[i];
    COHORT_CHECK(y >= 0 && y < k,
                 "label " << y << " of sample " << i << " is outside [0, " << k << ")");
    const float* row = zp + i * k;
    float mx = row[0];
    for (int64_t j = 1; j < k; ++j) mx = std::max(mx, row[j]);
    double se = 0;
    for (int64_t j = 0; j < k; ++j) se += std::exp(static_cast<double>(row[j] - mx));
    const double lse = mx + std::log(se);
    double smooth = 0;
    for (int64_t j = 0; j < k; ++j) {
      pp[i * k + j] = static_cast<float>(std::exp(row[j] - lse));
      smooth += lse - row[j];
    }
    total += (1.0 - smoothing) * (lse - row[y]) + smoothing * smooth / static_cast<double>(k);
  }
  Tensor loss = Tensor::full({1}, static_cast<float>(total / static_cast<double>(n)));
  Var out = constant(loss);
  if (recording(logits)) {
    Tape::current()->push(out, [logits, out, prob, labels, smoothing, n, k]() {
      const float scale = out->grad.data<float>()[0] / static_cast<float>(n);
      Tensor dz = Tensor::empty({n, k});
      const float* p = prob.data<float>();
      float* d = dz.data<float>();
      const float off = smoothing / static_cast<float>(k);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
          d[i * k + j] = scale * (p[i * k + j] - off - (j == labels[i] ? 1.0f - smoothing : 0.0f));
      accumulate(*logits, std::move(dz));
    });
  }
  return out;
}

Var bce_with_logits(const Var& logits, const Tensor& targets) {
  profile::Scope prof("loss");
  tensor::require_same_device("bce_with_logits", "logits", logits->value, "targets", targets);
  check_device("bce_with_logits", logits->value);
  Tensor z = logits->value.contiguous();
  Tensor t = targets.contiguous();
  COHORT_CHECK(z.shape() == t.shape(), "bce_with_logits: logits "
                                           << tensor::shape_string(z.shape()) << ", targets "
                                           << tensor::shape_string(t.shape()));
  const int64_t m = z.numel();
  const float* zp = z.data<float>();
  const float* tp = t.data<float>();
  double total = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double x = zp[i];
    total += std::max(x, 0.0) - x * tp[i] + std::log1p(std::exp(-std::abs(x)));
  }
  Var out = constant(Tensor::full({1}, static_cast<float>(total / static_cast<double>(m))));
  if (recording(logits)) {
    Tape::current()->push(out, [logits, out, z, t, m]() {
      const float scale = out->grad.data<float>()[0] / static_cast<float>(m);
      Tensor dz = Tensor::empty(z.shape());
      const float* zp = z.data<float>();
      const float* tp = t.data<float>();
      float* d = dz.data<float>();
      for (int64_t i = 0; i < m; ++i) d[i] = scale * (1.0f / (1.0f + std::exp(-zp[i])) - tp[i]);
      accumulate(*logits, std::move(dz));
    });
  }
  return out;
}

}  // namespace cohort::nn
