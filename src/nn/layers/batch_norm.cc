// BatchNorm2d on oneDNN (with the ReLU that follows fused), SyncBatchNorm's cross-rank
// statistics, and deferred and frozen statistics for pipeline stages.
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

// ---------------------------------------------------------------------------------------------
// BatchNorm2d

struct BatchNorm2d::Plan {
  dnnl::batch_normalization_forward::primitive_desc fwd_pd;
  dnnl::batch_normalization_forward fwd;
  dnnl::normalization_flags flags{};
  bool has_bwd = false;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd;
  dnnl::batch_normalization_backward bwd;
  Tensor dscale, dshift;
};

BatchNorm2d::BatchNorm2d(int channels, bool relu, float eps, float momentum)
    : c_(channels), relu_(relu), eps_(eps), momentum_(momentum) {
  COHORT_CHECK(channels > 0, "BatchNorm2d: channels " << channels);
  w_ = &add_param("weight", {channels}, false);
  b_ = &add_param("bias", {channels}, false);
  mean_ = &add_buffer("running_mean", Tensor::zeros({channels}));
  var_ = &add_buffer("running_var", Tensor::full({channels}, 1.0f));
  tracked_ = &add_buffer("num_batches_tracked", Tensor::zeros({}, DType::i64));
}

BatchNorm2d::~BatchNorm2d() = default;

void BatchNorm2d::reset_parameters(uint64_t) {
  w_->value.fill_(1.0f);
  b_->value.zero_();
  mean_->value.zero_();
  var_->value.fill_(1.0f);
  tracked_->value.zero_();
}

Var BatchNorm2d::forward(const Var& x_in) {
  profile::Scope prof("bn.fwd");
  need_value(*w_);
  need_value(*b_);
  tensor::require_same_device("BatchNorm2d", "input", x_in->value, "weight", w_->value);
  Tensor x = as_channels_last(x_in, "BatchNorm2d", c_);
  const bool train = training_;
  if (train && cross_rank_sum_) return forward_synced(x_in, x);
  auto& slot = plans_[{x.shape(), train}];
  if (!slot) {
    auto p = std::make_unique<Plan>();
    using F = dnnl::normalization_flags;
    p->flags = F::use_scale | F::use_shift;
    if (relu_) p->flags = p->flags | F::fuse_norm_relu;
    if (!train) p->flags = p->flags | F::use_global_stats;
    auto d = dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training,
                                                     nhwc(x.shape()), eps_, p->flags);
    p->fwd_pd = COHORT_DNNL(dnnl::batch_normalization_forward::primitive_desc(d, dn::engine()),
                            "BatchNorm2d forward, input " << tensor::shape_string(x.shape()));
    p->fwd = dnnl::batch_normalization_forward(p->fwd_pd);
    slot = std::move(p);
  }
  Plan& p = *slot;
  Tensor y = Tensor::empty(x.shape(), DType::f32, Order::channels_last);
  Tensor mean = train ? Tensor::empty({c_}) : mean_->value;
  Tensor var = train ? Tensor::empty({c_}) : var_->value;
  Tensor ws;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, dn::mem(x)},           {DNNL_ARG_DST, dn::mem(y)},
      {DNNL_ARG_SCALE, dn::mem(w_->value)}, {DNNL_ARG_SHIFT, dn::mem(b_->value)},
      {DNNL_ARG_MEAN, dn::mem(mean)},       {DNNL_ARG_VARIANCE, dn::mem(var)}};
  if (relu_) {
    ws = dn::empty_like(p.fwd_pd.workspace_desc());
    args[DNNL_ARG_WORKSPACE] = memory(p.fwd_pd.workspace_desc(), dn::engine(), ws.raw());
  }
  p.fwd.execute(dn::stream(), args);

  if (train && g_frozen_stats) {
    // A forward run again (recomputation): the statistics were counted the first time.
  } else if (train && !deferred_.empty()) {
    // Deferred: the sums this batch adds, from its mean and biased variance.
    const double n = static_cast<double>(x.numel() / c_);
    const float* bm = mean.data<float>();
    const float* bv = var.data<float>();
    for (int c = 0; c < c_; ++c) {
      deferred_[static_cast<size_t>(c)] += n * bm[c];
      deferred_[static_cast<size_t>(c_ + c)] += n * (bv[c] + static_cast<double>(bm[c]) * bm[c]);
    }
    deferred_[static_cast<size_t>(2 * c_)] += n;
  } else if (train) {
    // torch keeps the unbiased variance in running_var.
    const double n = static_cast<double>(x.numel() / c_);
    const float unbias = n > 1 ? static_cast<float>(n / (n - 1)) : 1.0f;
    float* rm = mean_->value.data<float>();
    float* rv = var_->value.data<float>();
    const float* bm = mean.data<float>();
    const float* bv = var.data<float>();
    for (int c = 0; c < c_; ++c) {
      rm[c] = (1 - momentum_) * rm[c] + momentum_ * bm[c];
      rv[c] = (1 - momentum_) * rv[c] + momentum_ * bv[c] * unbias;
    }
    tracked_->value.data<int64_t>()[0] += 1;
  }

  Var out = constant(y);
  if (Tape* tape = Tape::current()) {
    tape->use(*w_);
    tape->use(*b_);
    Plan* plan = &p;
    tape->push(out, [this, tape, plan, x_in, out, x, mean, var, ws]() {
      profile::Scope prof("bn.bwd");
      need_value(*w_);
      need_value(*b_);
      Plan& p = *plan;
      if (!p.has_bwd) {
        auto d = dnnl::batch_normalization_backward::desc(
            dnnl::prop_kind::backward, nhwc(x.shape()), nhwc(x.shape()), eps_, p.flags);
        p.bwd_pd = COHORT_DNNL(
            dnnl::batch_normalization_backward::primitive_desc(d, dn::engine(), p.fwd_pd),
            "BatchNorm2d backward, input " << tensor::shape_string(x.shape()));
        p.bwd = dnnl::batch_normalization_backward(p.bwd_pd);
        p.dscale = Tensor::empty({c_});
        p.dshift = Tensor::empty({c_});
        p.has_bwd = true;
      }
      Tensor dy = grad_like_value(out);
      Tensor dx = Tensor::empty(x.shape(), DType::f32, Order::channels_last);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, dn::mem(x)},
                                           {DNNL_ARG_MEAN, dn::mem(mean)},
                                           {DNNL_ARG_VARIANCE, dn::mem(var)},
                                           {DNNL_ARG_DIFF_DST, dn::mem(dy)},
                                           {DNNL_ARG_SCALE, dn::mem(w_->value)},
                                           // oneDNN 2.6 insists on the shift too.
                                           {DNNL_ARG_SHIFT, dn::mem(b_->value)},
                                           {DNNL_ARG_DIFF_SRC, dn::mem(dx)},
                                           {DNNL_ARG_DIFF_SCALE, dn::mem(p.dscale)},
                                           {DNNL_ARG_DIFF_SHIFT, dn::mem(p.dshift)}};
      if (relu_) {
        args[DNNL_ARG_WORKSPACE] = memory(p.fwd_pd.workspace_desc(), dn::engine(), ws.raw());
      }
      p.bwd.execute(dn::stream(), args);
      tensor::add_(w_->grad, p.dscale);
      tensor::add_(b_->grad, p.dshift);
      tape->param_done(*w_);
      tape->param_done(*b_);
      if (x_in->requires_grad) accumulate(*x_in, std::move(dx));
    });
  }
  return out;
}

void BatchNorm2d::defer_statistics(bool on) {
  COHORT_CHECK(!(on && cross_rank_sum_),
               "BatchNorm2d: deferred statistics and SyncBatchNorm "
               "are exclusive");
  deferred_.assign(on ? static_cast<size_t>(2 * c_ + 1) : 0, 0.0);
}

void BatchNorm2d::commit_statistics() {
  if (deferred_.empty()) return;
  const double n = deferred_[static_cast<size_t>(2 * c_)];
  if (n > 0) {
    float* rm = mean_->value.data<float>();
    float* rv = var_->value.data<float>();
    for (int c = 0; c < c_; ++c) {
      const double m = deferred_[static_cast<size_t>(c)] / n;
      const double v = std::max(0.0, deferred_[static_cast<size_t>(c_ + c)] / n - m * m);
      rm[c] = (1 - momentum_) * rm[c] + momentum_ * static_cast<float>(m);
      rv[c] = (1 - momentum_) * rv[c] + momentum_ * static_cast<float>(n > 1 ? v * n / (n - 1) : v);
    }
    tracked_->value.data<int64_t>()[0] += 1;
  }
  std::fill(deferred_.begin(), deferred_.end(), 0.0);
}

FrozenBatchNormStatistics::FrozenBatchNormStatistics() : prev_(g_frozen_stats) {
  g_frozen_stats = true;
}
FrozenBatchNormStatistics::~FrozenBatchNormStatistics() {
  g_frozen_stats = prev_;
}

uint64_t forward_macs() {
  return g_macs.load(std::memory_order_relaxed);
}

void defer_batch_norm_statistics(Module& root, bool on) {
  std::vector<std::pair<std::string, Module*>> mods;
  root.modules("", &mods);
  for (auto& [name, m] : mods)
    if (auto* b = dynamic_cast<BatchNorm2d*>(m)) b->defer_statistics(on);
}

void commit_batch_norm_statistics(Module& root) {
  std::vector<std::pair<std::string, Module*>> mods;
  root.modules("", &mods);
  for (auto& [name, m] : mods)
    if (auto* b = dynamic_cast<BatchNorm2d*>(m)) b->commit_statistics();
}

// Batch statistics of the global batch: every rank contributes its sums, so the result is what
// one BatchNorm over all ranks' samples computes.
Var BatchNorm2d::forward_synced(const Var& x_in, const Tensor& x) {
  const int64_t c = c_, pixels = x.numel() / c_;
  const float* xp = x.data<float>();
  std::vector<double> buf(2 * c + 1, 0.0);
  double* s = buf.data();
  double* ss = buf.data() + c;
#pragma omp parallel for reduction(+ : s[:c], ss[:c])
  for (int64_t p = 0; p < pixels; ++p) {
    const float* row = xp + p * c;
    for (int64_t k = 0; k < c; ++k) {
      s[k] += row[k];
      ss[k] += static_cast<double>(row[k]) * row[k];
    }
  }
  buf[2 * c] = static_cast<double>(pixels);
  cross_rank_sum_(buf.data(), buf.size());
  const double count = buf[2 * c];
  Tensor mean = Tensor::empty({c}), invstd = Tensor::empty({c});
  float* mp = mean.data<float>();
  float* ip = invstd.data<float>();
  float* rm = mean_->value.data<float>();
  float* rv = var_->value.data<float>();
  for (int64_t k = 0; k < c; ++k) {
    const double m = s[k] / count;
    const double v = std::max(0.0, ss[k] / count - m * m);
    mp[k] = static_cast<float>(m);
    ip[k] = static_cast<float>(1.0 / std::sqrt(v + eps_));
    if (g_frozen_stats) continue;
    rm[k] = (1 - momentum_) * rm[k] + momentum_ * static_cast<float>(m);
    rv[k] = (1 - momentum_) * rv[k] +
            momentum_ * static_cast<float>(count > 1 ? v * count / (count - 1) : v);
  }
  if (!g_frozen_stats) tracked_->value.data<int64_t>()[0] += 1;
  Tensor y = Tensor::empty(x.shape(), DType::f32, Order::channels_last);
  float* yp = y.data<float>();
  const float* g = w_->value.data<float>();
  const float* b = b_->value.data<float>();
  const bool relu = relu_;
#pragma omp parallel for
  for (int64_t p = 0; p < pixels; ++p) {
    const float* row = xp + p * c;
    float* out = yp + p * c;
    for (int64_t k = 0; k < c; ++k) {
      const float v = (row[k] - mp[k]) * ip[k] * g[k] + b[k];
      out[k] = relu && v < 0 ? 0.0f : v;
    }
  }
  Var out = constant(y);
  if (Tape* tape = Tape::current()) {
    tape->use(*w_);
    tape->use(*b_);
    tape->push(out, [this, tape, x_in, out, x, mean, invstd, count, pixels]() {
      profile::Scope prof("syncbn.bwd");
      need_value(*w_);
      const int64_t c = c_;
      Tensor dy = grad_like_value(out);
      const float* gp = dy.data<float>();
      const float* yp = out->value.data<float>();
      const float* xp = x.data<float>();
      const float* mp = mean.data<float>();
      const float* ip = invstd.data<float>();
      const bool relu = relu_;
      std::vector<double> sums(2 * c, 0.0);
      double* sdy = sums.data();
      double* sdyx = sums.data() + c;
#pragma omp parallel for reduction(+ : sdy[:c], sdyx[:c])
      for (int64_t p = 0; p < pixels; ++p) {
        for (int64_t k = 0; k < c; ++k) {
          const int64_t i = p * c + k;
          const float d = relu && yp[i] <= 0 ? 0.0f : gp[i];
          sdy[k] += d;
          sdyx[k] += static_cast<double>(d) * (xp[i] - mp[k]) * ip[k];
        }
      }
      // The parameters' gradients are this rank's share; DDP averages them like any other.
      float* dg = w_->grad.data<float>();
      float* db = b_->grad.data<float>();
      for (int64_t k = 0; k < c; ++k) {
        dg[k] += static_cast<float>(sdyx[k]);
        db[k] += static_cast<float>(sdy[k]);
      }
      tape->param_done(*w_);
      tape->param_done(*b_);
      if (!x_in->requires_grad) return;
      cross_rank_sum_(sums.data(), sums.size());
      Tensor dx = Tensor::empty(x.shape(), DType::f32, Order::channels_last);
      float* dp = dx.data<float>();
      const float* g = w_->value.data<float>();
#pragma omp parallel for
      for (int64_t p = 0; p < pixels; ++p) {
        for (int64_t k = 0; k < c; ++k) {
          const int64_t i = p * c + k;
          const float d = relu && yp[i] <= 0 ? 0.0f : gp[i];
          const float xhat = (xp[i] - mp[k]) * ip[k];
          dp[i] =
              g[k] * ip[k] *
              (d - static_cast<float>(sdy[k] / count) - xhat * static_cast<float>(sdyx[k] / count));
        }
      }
      accumulate(*x_in, std::move(dx));
    });
  }
  return out;
}

}  // namespace cohort::nn
