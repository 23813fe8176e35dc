#include "cohort/nn/optim.h"

#include <cmath>

namespace cohort::nn {

size_t OptimTarget::numel() const {
  size_t n = 0;
  for (const FlatRange& r : ranges) n += r.n;
  return n;
}

size_t OptimTarget::state_at(size_t range) const {
  size_t n = 0;
  for (size_t i = 0; i < range; ++i) n += ranges[i].n;
  return n;
}

OptimTarget whole_model(Model& m) {
  OptimTarget t;
  t.ranges.push_back({m.flat_values().data<float>(), m.flat_grads().data<float>(),
                      static_cast<size_t>(m.flat_values().numel())});
  for (Param* p : m.params()) {
    t.pieces.push_back(
        {p->index, 0, static_cast<size_t>(p->value.numel()), 0, p->offset, p->decay});
  }
  t.num_params = static_cast<int>(m.params().size());
  return t;
}

namespace {

class Sgd : public Optimizer {
 public:
  Sgd(const OptimTarget& t, const OptimOptions& o) : t_(t), o_(o) {
    if (o.momentum != 0) buf_ = Tensor::zeros({static_cast<int64_t>(t.numel())});
  }
  void step(float lr) override {
    const float wd = o_.weight_decay, mu = o_.momentum;
    const bool nesterov = o_.nesterov;
    float* state = buf_.defined() ? buf_.data<float>() : nullptr;
    for (const FlatRange& r : t_.ranges) {
      float* w = r.w;
      const float* g = r.g;
      const int64_t n = static_cast<int64_t>(r.n);
      if (mu == 0) {
#pragma omp parallel for simd if (n > (1 << 16))
        for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
        continue;
      }
      float* b = state;
      state += r.n;
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
  size_t state_bytes_per_element() const override {
    return buf_.defined() ? 4 : 0;
  }

 private:
  OptimTarget t_;
  OptimOptions o_;
  Tensor buf_;
};

class AdamW : public Optimizer {
 public:
  AdamW(const OptimTarget& t, const OptimOptions& o) : t_(t), o_(o) {
    m1_ = Tensor::zeros({static_cast<int64_t>(t.numel())});
    m2_ = Tensor::zeros({static_cast<int64_t>(t.numel())});
  }
  void step(float lr) override {
    steps_++;
    const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, wd = o_.weight_decay;
    const float c1 = 1.0f / (1.0f - std::pow(b1, static_cast<float>(steps_)));
    const float c2 = 1.0f / std::sqrt(1.0f - std::pow(b2, static_cast<float>(steps_)));
    float* a = m1_.data<float>();
    float* v = m2_.data<float>();
    for (const FlatRange& r : t_.ranges) {
      float* w = r.w;
      const float* g = r.g;
      const int64_t n = static_cast<int64_t>(r.n);
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        w[i] -= lr * wd * w[i];
        a[i] = b1 * a[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        w[i] -= lr * (a[i] * c1) / (std::sqrt(v[i]) * c2 + eps);
      }
      a += r.n;
      v += r.n;
    }
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"exp_avg", &m1_}, {"exp_avg_sq", &m2_}};
  }
  size_t state_bytes_per_element() const override {
    return 8;
  }

 private:
  OptimTarget t_;
  OptimOptions o_;
  Tensor m1_, m2_;
};

// LARS (You et al. 2017): each decayed parameter's step is scaled by
// eta * |w| / (|g| + wd |w|); norms and biases take plain momentum SGD without decay. A sharded
// parameter's norms are its pieces' partial sums, summed over the ranks.
class Lars : public Optimizer {
 public:
  Lars(const OptimTarget& t, const OptimOptions& o) : t_(t), o_(o) {
    buf_ = Tensor::zeros({static_cast<int64_t>(t.numel())});
    for (size_t i = 0; i < t.ranges.size(); ++i) state_at_.push_back(t.state_at(i));
  }
  void step(float lr) override {
    std::vector<double> sums(2 * static_cast<size_t>(t_.num_params), 0.0);  // |w|^2 then |g|^2
    for (const ParamPiece& p : t_.pieces) {
      const FlatRange& r = t_.ranges[p.range];
      const int64_t n = static_cast<int64_t>(p.hi - p.lo);
      const float* w = r.w + p.at;
      const float* g = r.g + p.at;
      double ww = 0, gg = 0;
#pragma omp parallel for simd reduction(+ : ww, gg) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        ww += static_cast<double>(w[i]) * w[i];
        gg += static_cast<double>(g[i]) * g[i];
      }
      sums[static_cast<size_t>(p.param)] += ww;
      sums[static_cast<size_t>(t_.num_params + p.param)] += gg;
    }
    if (t_.sum_across) t_.sum_across(sums.data(), sums.size());
    const float mu = o_.momentum;
    for (const ParamPiece& p : t_.pieces) {
      const FlatRange& r = t_.ranges[p.range];
      float* w = r.w + p.at;
      const float* g = r.g + p.at;
      float* b = buf_.data<float>() + state_at_[p.range] + p.at;
      float trust = 1.0f, wd = 0.0f;
      if (p.decay) {
        wd = o_.weight_decay;
        const double wn = std::sqrt(sums[static_cast<size_t>(p.param)]);
        const double gn = std::sqrt(sums[static_cast<size_t>(t_.num_params + p.param)]);
        if (wn > 0 && gn > 0) trust = static_cast<float>(o_.trust * wn / (gn + wd * wn));
      }
      const int64_t n = static_cast<int64_t>(p.hi - p.lo);
      for (int64_t i = 0; i < n; ++i) {
        b[i] = mu * b[i] + trust * (g[i] + wd * w[i]);
        w[i] -= lr * b[i];
      }
    }
    steps_++;
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"momentum", &buf_}};
  }
  size_t state_bytes_per_element() const override {
    return 4;
  }

 private:
  OptimTarget t_;
  OptimOptions o_;
  Tensor buf_;
  std::vector<size_t> state_at_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimTarget& t, const OptimOptions& o) {
  if (o.kind == "sgd") return std::make_unique<Sgd>(t, o);
  if (o.kind == "adamw") return std::make_unique<AdamW>(t, o);
  if (o.kind == "lars") return std::make_unique<Lars>(t, o);
  COHORT_THROW("unknown optimizer '" << o.kind << "' (known: sgd, adamw, lars)");
}

std::unique_ptr<Optimizer> make_optimizer(Model& m, const OptimOptions& o) {
  return make_optimizer(whole_model(m), o);
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

double clip_grad_norm(const OptimTarget& t, double max_norm) {
  COHORT_CHECK(max_norm > 0, "clip_grad_norm: max norm " << max_norm);
  double ss = 0;
  for (const FlatRange& r : t.ranges) {
    ss += tensor::sum_squares(Tensor::wrap(r.g, {static_cast<int64_t>(r.n)}, tensor::DType::f32));
  }
  if (t.sum_across) t.sum_across(&ss, 1);
  const double norm = std::sqrt(ss);
  if (norm > max_norm) {
    const float k = static_cast<float>(max_norm / (norm + 1e-6));
    for (const FlatRange& r : t.ranges) {
      Tensor g = Tensor::wrap(r.g, {static_cast<int64_t>(r.n)}, tensor::DType::f32);
      tensor::scale_(g, k);
    }
  }
  return norm;
}

double clip_grad_norm(Model& m, double max_norm) {
  return clip_grad_norm(whole_model(m), max_norm);
}

float linear_scaled_lr(float lr, int64_t global_batch, int64_t reference) {
  COHORT_CHECK(global_batch > 0 && reference > 0,
               "linear scaling: global batch " << global_batch << ", reference " << reference);
  return lr * static_cast<float>(global_batch) / static_cast<float>(reference);
}

}  // namespace cohort::nn
