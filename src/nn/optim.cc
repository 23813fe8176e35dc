#include "cohort/nn/optim.h"

#include <cmath>

namespace cohort::nn {

namespace {

class Sgd : public Optimizer {
 public:
  Sgd(Model& m, const OptimOptions& o) : m_(m), o_(o) {
    if (o.momentum != 0) buf_ = Tensor::zeros(m.flat_values().shape());
  }
  void step(float lr) override {
    float* w = m_.flat_values().data<float>();
    const float* g = m_.flat_grads().data<float>();
    const int64_t n = m_.flat_values().numel();
    const float wd = o_.weight_decay, mu = o_.momentum;
    if (mu == 0) {
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else {
      float* b = buf_.data<float>();
      const bool nesterov = o_.nesterov;
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        b[i] = mu * b[i] + d;
        w[i] -= lr * (nesterov ? d + mu * b[i] : b[i]);
      }
    }
    steps_++;
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    if (!buf_.defined()) return {};
    return {{"momentum", &buf_}};
  }

 private:
  Model& m_;
  OptimOptions o_;
  Tensor buf_;
};

class AdamW : public Optimizer {
 public:
  AdamW(Model& m, const OptimOptions& o) : m_(m), o_(o) {
    m1_ = Tensor::zeros(m.flat_values().shape());
    m2_ = Tensor::zeros(m.flat_values().shape());
  }
  void step(float lr) override {
    steps_++;
    float* w = m_.flat_values().data<float>();
    const float* g = m_.flat_grads().data<float>();
    float* a = m1_.data<float>();
    float* v = m2_.data<float>();
    const int64_t n = m_.flat_values().numel();
    const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, wd = o_.weight_decay;
    const float c1 = 1.0f / (1.0f - std::pow(b1, static_cast<float>(steps_)));
    const float c2 = 1.0f / std::sqrt(1.0f - std::pow(b2, static_cast<float>(steps_)));
#pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      w[i] -= lr * wd * w[i];
      a[i] = b1 * a[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr * (a[i] * c1) / (std::sqrt(v[i]) * c2 + eps);
    }
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"exp_avg", &m1_}, {"exp_avg_sq", &m2_}};
  }

 private:
  Model& m_;
  OptimOptions o_;
  Tensor m1_, m2_;
};

// LARS (You et al. 2017): each decayed parameter's step is scaled by
// eta * |w| / (|g| + wd |w|); norms and biases take plain momentum SGD without decay.
class Lars : public Optimizer {
 public:
  Lars(Model& m, const OptimOptions& o) : m_(m), o_(o) {
    buf_ = Tensor::zeros(m.flat_values().shape());
  }
  void step(float lr) override {
    float* b = buf_.data<float>();
    for (Param* p : m_.params()) {
      float* w = p->value.data<float>();
      const float* g = p->grad.data<float>();
      const int64_t n = p->value.numel();
      float* bp = b + p->offset;
      float trust = 1.0f, wd = 0.0f;
      if (p->decay) {
        wd = o_.weight_decay;
        const double wn = std::sqrt(tensor::sum_squares(p->value));
        const double gn = std::sqrt(tensor::sum_squares(p->grad));
        if (wn > 0 && gn > 0) trust = static_cast<float>(o_.trust * wn / (gn + wd * wn));
      }
      const float mu = o_.momentum;
      for (int64_t i = 0; i < n; ++i) {
        bp[i] = mu * bp[i] + trust * (g[i] + wd * w[i]);
        w[i] -= lr * bp[i];
      }
    }
    steps_++;
  }
  std::vector<std::pair<std::string, Tensor*>> state() override { return {{"momentum", &buf_}}; }

 private:
  Model& m_;
  OptimOptions o_;
  Tensor buf_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(Model& m, const OptimOptions& o) {
  if (o.kind == "sgd") return std::make_unique<Sgd>(m, o);
  if (o.kind == "adamw") return std::make_unique<AdamW>(m, o);
  if (o.kind == "lars") return std::make_unique<Lars>(m, o);
  COHORT_THROW("unknown optimizer '" << o.kind << "' (known: sgd, adamw, lars)");
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  if (kind == "constant") return lr;
  if (kind == "step") {
    if (step_every <= 0) return lr;
    return lr * std::pow(gamma, static_cast<float>((step - warmup_steps) / step_every));
  }
  if (kind == "cosine") {
    const double span = static_cast<double>(std::max<int64_t>(total_steps - warmup_steps, 1));
    const double t = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
    return static_cast<float>(lr * 0.5 * (1.0 + std::cos(M_PI * t)));
  }
  COHORT_THROW("unknown lr schedule '" << kind << "' (known: cosine, step, constant)");
}

double clip_grad_norm(Model& m, double max_norm) {
  COHORT_CHECK(max_norm > 0, "clip_grad_norm: max norm " << max_norm);
  const double norm = std::sqrt(tensor::sum_squares(m.flat_grads()));
  if (norm > max_norm) tensor::scale_(m.flat_grads(), static_cast<float>(max_norm / (norm + 1e-6)));
  return norm;
}

float linear_scaled_lr(float lr, int64_t global_batch, int64_t reference) {
  COHORT_CHECK(global_batch > 0 && reference > 0,
               "linear scaling: global batch " << global_batch << ", reference " << reference);
  return lr * static_cast<float>(global_batch) / static_cast<float>(reference);
}

}  // namespace cohort::nn
