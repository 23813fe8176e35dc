#include "cohort/nn/layers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "cohort/core/clock.h"
#include "cohort/core/rng.h"
#include "cohort/nn/init.h"
#include "cohort/tensor/onednn.h"

namespace cohort::nn {

using dnnl::memory;
using tensor::Order;
namespace dn = tensor::onednn;

namespace {

constexpr auto kF32 = memory::data_type::f32;
std::atomic<uint64_t> g_macs{0};
thread_local bool g_frozen_stats = false;

Tensor as_channels_last(const Var& x, const char* layer, int channels) {
  const Tensor& t = x->value;
  COHORT_CHECK(t.dim() == 4,
               layer << " needs a 4-d [N, C, H, W] input, got " << tensor::shape_string(t.shape()));
  COHORT_CHECK(channels <= 0 || t.size(1) == channels,
               layer << " expects " << channels << " input channels, got " << t.size(1)
                     << " (input " << tensor::shape_string(t.shape()) << ")");
  return t.is_channels_last() ? t : t.channels_last();
}

// The gradient that arrived for `out`, in the layout of out's value (a copy only if it differs).
Tensor grad_like_value(const Var& out) {
  return out->grad.strides() == out->value.strides() ? out->grad
                                                     : out->grad.clone(out->value.order());
}

memory::desc nhwc(const Shape& s, memory::data_type t = kF32) {
  return memory::desc(dn::dims(s), t, memory::format_tag::nhwc);
}

// The same values in another type and the same layout, by a oneDNN reorder.
Tensor convert(const Tensor& t, DType to) {
  Tensor out = Tensor::empty(t.shape(), to, t.order());
  dn::reorder(dn::mem(t), dn::mem(out));
  return out;
}

DType g_compute = DType::f32;

memory::desc vec(int64_t n) {
  return memory::desc({n}, kF32, memory::format_tag::a);
}

// Reorders when oneDNN wants another layout; otherwise uses the tensor's memory as it is. The
// reordered copy lives in `scratch`, taken from the caching allocator for this call only: kept
// per layer, such copies would cost a second and third copy of every weight.
memory as_layout(const memory& user, const memory::desc& want, Tensor* scratch) {
  if (user.get_desc() == want) return user;
  *scratch = dn::empty_like(want);
  memory m(want, dn::engine(), scratch->raw());
  dn::reorder(user, m);
  return m;
}

int64_t out_size(int64_t in, int k, int s, int p, int d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

}  // namespace

void set_compute_type(DType t) {
  COHORT_CHECK(compute_type_supported(t),
               tensor::dtype_name(t) << " convolutions are not available in oneDNN on this CPU");
  g_compute = t;
}

DType compute_type() {
  return g_compute;
}

bool compute_type_supported(DType t) {
  if (t == DType::f32) return true;
  if (t != DType::bf16 && t != DType::f16) return false;
  // Ask oneDNN for a small training convolution in that type.
  try {
    const auto dt = dn::dt(t);
    memory::desc src({2, 16, 8, 8}, dt, memory::format_tag::nhwc);
    memory::desc dst({2, 16, 8, 8}, kF32, memory::format_tag::nhwc);
    memory::desc wei({16, 16, 3, 3}, dt, memory::format_tag::any);
    auto d = dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                             dnnl::algorithm::convolution_direct, src, wei, dst,
                                             {1, 1}, {1, 1}, {1, 1});
    dnnl::convolution_forward::primitive_desc pd(d, dn::engine());
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Profile

namespace profile {
namespace {
bool g_on = false;
std::mutex g_mu;
std::map<const char*, Entry>& table() {
  static std::map<const char*, Entry> t;
  return t;
}
}  // namespace

void enable(bool on) {
  g_on = on;
}
bool enabled() {
  return g_on;
}
void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  table().clear();
}
std::vector<Entry> entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Entry> out;
  // Equal literals in different files may have different addresses: merge by name.
  std::map<std::string, Entry> by_name;
  for (auto& [k, e] : table()) {
    Entry& m = by_name[e.op];
    m.op = e.op;
    m.seconds += e.seconds;
    m.calls += e.calls;
  }
  for (auto& [k, e] : by_name) out.push_back(e);
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}
Scope::Scope(const char* op) : op_(op), on_(g_on), outer_(timeline::open_scope(op)) {
  if (on_ || timeline::enabled()) t0_ = Clock::now();
}
Scope::~Scope() {
  const long recorded = timeline::close_scope(outer_);
  if (!on_ && !timeline::enabled()) return;
  const double dt = seconds_since(t0_);
  timeline::add_forward(recorded, dt);
  if (!on_) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Entry& e = table()[op_];
  e.op = op_;
  e.seconds += dt;
  e.calls++;
}
}  // namespace profile

// ---------------------------------------------------------------------------------------------
// Conv2d

struct Conv2d::Plan {
  Shape out_shape;
  memory::desc w_plain;  // torch's [O, I/G, KH, KW]
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  bool has_bwd = false;
  dnnl::convolution_backward_data::primitive_desc bwd_d_pd;
  dnnl::convolution_backward_data bwd_d;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_weights bwd_w;
  memory::dims strides, dil, pad;
};

Conv2d::Conv2d(Conv2dOptions o) : o_(o) {
  COHORT_CHECK(o.in > 0 && o.out > 0 && o.kernel > 0 && o.stride > 0 && o.dilation > 0 &&
                   o.groups > 0 && o.in % o.groups == 0 && o.out % o.groups == 0,
               "Conv2d: in " << o.in << ", out " << o.out << ", kernel " << o.kernel << ", stride "
                             << o.stride << ", groups " << o.groups);
  w_ = &add_param("weight", {o.out, o.in / o.groups, o.kernel, o.kernel});
  if (o.bias) b_ = &add_param("bias", {o.out}, false);
}

Conv2d::~Conv2d() = default;

void Conv2d::reset_parameters(uint64_t seed) {
  const int64_t fan = fan_out ? int64_t{o_.out} / o_.groups * o_.kernel * o_.kernel
                              : int64_t{o_.in} / o_.groups * o_.kernel * o_.kernel;
  init::normal(w_->value, 0.0, std::sqrt(2.0 / static_cast<double>(fan)), seed);
  if (b_) {
    const int64_t fan_in = int64_t{o_.in} / o_.groups * o_.kernel * o_.kernel;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform(b_->value, -bound, bound, mix64(seed ^ 0xb1a5));
  }
}

Var Conv2d::forward(const Var& x_in) {
  profile::Scope prof("conv.fwd");
  need_value(*w_);
  if (b_) need_value(*b_);
  Tensor x32 = as_channels_last(x_in, "Conv2d", o_.in);
  const DType ct = compute_type();
  const auto cdt = dn::dt(ct);
  // Lower precision: the input goes in converted; weights convert in the reorder they need
  // anyway; outputs and gradients stay f32.
  Tensor x = ct == DType::f32 ? x32 : convert(x32, ct);
  auto& slot = plans_[{x.shape(), static_cast<int>(ct)}];
  if (!slot) {
    auto p = std::make_unique<Plan>();
    const int64_t oh = out_size(x.size(2), o_.kernel, o_.stride, o_.padding, o_.dilation);
    const int64_t ow = out_size(x.size(3), o_.kernel, o_.stride, o_.padding, o_.dilation);
    COHORT_CHECK(oh > 0 && ow > 0, "Conv2d: input " << tensor::shape_string(x.shape())
                                                    << " is smaller than kernel " << o_.kernel);
    p->out_shape = {x.size(0), o_.out, oh, ow};
    const int g = o_.groups;
    p->w_plain =
        g == 1 ? memory::desc({o_.out, o_.in, o_.kernel, o_.kernel}, kF32, memory::format_tag::oihw)
               : memory::desc({g, o_.out / g, o_.in / g, o_.kernel, o_.kernel}, kF32,
                              memory::format_tag::goihw);
    memory::desc w_any(p->w_plain.dims(), cdt, memory::format_tag::any);
    p->strides = {o_.stride, o_.stride};
    p->dil = {o_.dilation - 1, o_.dilation - 1};
    p->pad = {o_.padding, o_.padding};
    auto d = b_ ? dnnl::convolution_forward::desc(
                      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                      nhwc(x.shape(), cdt), w_any, vec(o_.out), nhwc(p->out_shape), p->strides,
                      p->dil, p->pad, p->pad)
                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                  dnnl::algorithm::convolution_direct,
                                                  nhwc(x.shape(), cdt), w_any, nhwc(p->out_shape),
                                                  p->strides, p->dil, p->pad, p->pad);
    p->fwd_pd = COHORT_DNNL(dnnl::convolution_forward::primitive_desc(d, dn::engine()),
                            "Conv2d forward, input " << tensor::shape_string(x.shape()));
    p->fwd = dnnl::convolution_forward(p->fwd_pd);
    slot = std::move(p);
  }
  Plan& p = *slot;
  Tensor y = Tensor::empty(p.out_shape, DType::f32, Order::channels_last);
  g_macs.fetch_add(static_cast<uint64_t>(y.numel()) * static_cast<uint64_t>(o_.in / o_.groups) *
                       static_cast<uint64_t>(o_.kernel * o_.kernel),
                   std::memory_order_relaxed);
  Tensor w_scratch;
  memory w = as_layout(memory(p.w_plain, dn::engine(), w_->value.raw()), p.fwd_pd.weights_desc(),
                       &w_scratch);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, dn::mem(x)}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dn::mem(y)}};
  if (b_) args[DNNL_ARG_BIAS] = memory(vec(o_.out), dn::engine(), b_->value.raw());
  p.fwd.execute(dn::stream(), args);

  Var out = constant(y);
  if (Tape* tape = Tape::current()) {
    tape->use(*w_);
    if (b_) tape->use(*b_);
    Plan* plan = &p;
    tape->push(out, [this, tape, plan, x_in, out, x, ct, cdt]() {
      need_value(*w_);  // backward data reads the weights
      Plan& p = *plan;
      if (!p.has_bwd) {
        auto dd = dnnl::convolution_backward_data::desc(
            dnnl::algorithm::convolution_direct, nhwc(x.shape()),
            memory::desc(p.w_plain.dims(), cdt, memory::format_tag::any), nhwc(p.out_shape, cdt),
            p.strides, p.dil, p.pad, p.pad);
        p.bwd_d_pd =
            COHORT_DNNL(dnnl::convolution_backward_data::primitive_desc(dd, dn::engine(), p.fwd_pd),
                        "Conv2d backward data, input " << tensor::shape_string(x.shape()));
        p.bwd_d = dnnl::convolution_backward_data(p.bwd_d_pd);
        memory::desc w_any(p.w_plain.dims(), kF32, memory::format_tag::any);
        auto wd = b_ ? dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, nhwc(x.shape(), cdt), w_any,
                           vec(o_.out), nhwc(p.out_shape, cdt), p.strides, p.dil, p.pad, p.pad)
                     : dnnl::convolution_backward_weights::desc(
                           dnnl::algorithm::convolution_direct, nhwc(x.shape(), cdt), w_any,
                           nhwc(p.out_shape, cdt), p.strides, p.dil, p.pad, p.pad);
        p.bwd_w_pd = COHORT_DNNL(
            dnnl::convolution_backward_weights::primitive_desc(wd, dn::engine(), p.fwd_pd),
            "Conv2d backward weights, input " << tensor::shape_string(x.shape()));
        p.bwd_w = dnnl::convolution_backward_weights(p.bwd_w_pd);
        p.has_bwd = true;
      }
      Tensor dy = grad_like_value(out);
      if (ct != DType::f32) dy = convert(dy, ct);
      {
        profile::Scope prof("conv.bwd_w");
        const memory::desc dwd = p.bwd_w_pd.diff_weights_desc();
        Tensor dw_scratch = dn::empty_like(dwd), db;
        memory dw(dwd, dn::engine(), dw_scratch.raw());
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC, dn::mem(x)},
                                             {DNNL_ARG_DIFF_DST, dn::mem(dy)},
                                             {DNNL_ARG_DIFF_WEIGHTS, dw}};
        if (b_) {
          db = Tensor::empty({o_.out});
          args[DNNL_ARG_DIFF_BIAS] = dn::mem(db);
        }
        p.bwd_w.execute(dn::stream(), args);
        dn::reorder(dw, memory(p.w_plain, dn::engine(), w_->grad.raw()), /*accumulate=*/true);
        tape->param_done(*w_);
        if (b_) {
          tensor::add_(b_->grad, db);
          tape->param_done(*b_);
        }
      }
      if (x_in->requires_grad) {
        profile::Scope prof("conv.bwd_d");
        Tensor dx = Tensor::empty(x.shape(), DType::f32, Order::channels_last);
        Tensor w_scratch;
        memory w = as_layout(memory(p.w_plain, dn::engine(), w_->value.raw()),
                             p.bwd_d_pd.weights_desc(), &w_scratch);
        p.bwd_d.execute(dn::stream(), {{DNNL_ARG_DIFF_DST, dn::mem(dy)},
                                       {DNNL_ARG_WEIGHTS, w},
                                       {DNNL_ARG_DIFF_SRC, dn::mem(dx)}});
        accumulate(*x_in, std::move(dx));
      }
    });
  }
  return out;
}

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

// ---------------------------------------------------------------------------------------------
// Elementwise

Var relu(const Var& x) {
  profile::Scope prof("relu.fwd");
  const Tensor& xv = x->value;
  COHORT_CHECK(xv.is_dense() && xv.dtype() == DType::f32, "relu needs a dense f32 tensor");
  Tensor y = Tensor::empty(xv.shape(), DType::f32, xv.order());
  const float* s = xv.data<float>();
  float* d = y.data<float>();
  const int64_t n = xv.numel();
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = s[i] > 0 ? s[i] : 0.0f;
  Var out = constant(y);
  if (recording(x)) {
    Tape::current()->push(out, [x, out]() {
      profile::Scope prof("relu.bwd");
      const Tensor& yv = out->value;
      Tensor dy = grad_like_value(out);
      Tensor dx = Tensor::empty(yv.shape(), DType::f32, yv.order());
      const float* o = yv.data<float>();
      const float* g = dy.data<float>();
      float* r = dx.data<float>();
      const int64_t n = yv.numel();
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) r[i] = o[i] > 0 ? g[i] : 0.0f;
      accumulate(*x, std::move(dx));
    });
  }
  return out;
}

Var ReLU::forward(const Var& x) {
  return relu(x);
}

namespace {

Var add_impl(const Var& a, const Var& b, bool then_relu) {
  profile::Scope prof("add.fwd");
  Tensor av = a->value, bv = b->value;
  COHORT_CHECK(av.shape() == bv.shape(), "add: " << tensor::shape_string(av.shape()) << " + "
                                                 << tensor::shape_string(bv.shape()));
  if (av.dim() == 4) {
    av = av.channels_last();
    bv = bv.channels_last();
  } else {
    av = av.contiguous();
    bv = bv.contiguous();
  }
  Tensor y = Tensor::empty(av.shape(), DType::f32, av.order());
  const float* p = av.data<float>();
  const float* q = bv.data<float>();
  float* d = y.data<float>();
  const int64_t n = y.numel();
  if (then_relu) {
#pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = std::max(p[i] + q[i], 0.0f);
  } else {
#pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = p[i] + q[i];
  }
  Var out = constant(y);
  Tape* tape = Tape::current();
  if (tape && (a->requires_grad || b->requires_grad)) {
    tape->push(out, [a, b, out, then_relu]() {
      profile::Scope prof("add.bwd");
      const Tensor& yv = out->value;
      const Order order = yv.order();
      Tensor g = grad_like_value(out);
      out->grad = Tensor();
      if (then_relu) {
        // In place when nobody else holds the gradient: no new buffer the size of the output.
        Tensor m = g.block().use_count() == 1 ? g : Tensor::empty(yv.shape(), DType::f32, order);
        const float* o = yv.data<float>();
        const float* s = g.data<float>();
        float* r = m.data<float>();
        const int64_t n = yv.numel();
#pragma omp parallel for simd if (n > (1 << 16))
        for (int64_t i = 0; i < n; ++i) r[i] = o[i] > 0 ? s[i] : 0.0f;
        g = m;
      }
      if (a->requires_grad) accumulate(*a, g);
      if (b->requires_grad) accumulate(*b, g);
    });
  }
  return out;
}

}  // namespace

Var add(const Var& a, const Var& b) {
  return add_impl(a, b, false);
}
Var add_relu(const Var& a, const Var& b) {
  return add_impl(a, b, true);
}

// ---------------------------------------------------------------------------------------------
// Pooling

struct Pool2d::Plan {
  Shape out_shape;
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  bool has_bwd = false;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_backward bwd;
  memory::dims strides, kernel, pad_l, pad_r;
};

Pool2d::Pool2d(PoolKind kind, PoolOptions o) : kind_(kind), o_(o) {
  COHORT_CHECK(
      o.kernel > 0 && o.stride > 0 && o.padding >= 0 && 2 * o.padding <= o.kernel,
      "pooling: kernel " << o.kernel << ", stride " << o.stride << ", padding " << o.padding);
}

Pool2d::~Pool2d() = default;

Var Pool2d::forward(const Var& x_in) {
  profile::Scope prof("pool.fwd");
  Tensor x = as_channels_last(x_in, kind_ == PoolKind::max ? "MaxPool2d" : "AvgPool2d", 0);
  const auto alg = kind_ == PoolKind::max ? dnnl::algorithm::pooling_max
                                          : dnnl::algorithm::pooling_avg_include_padding;
  auto& slot = plans_[x.shape()];
  if (!slot) {
    auto p = std::make_unique<Plan>();
    const int64_t oh = out_size(x.size(2), o_.kernel, o_.stride, o_.padding, 1);
    const int64_t ow = out_size(x.size(3), o_.kernel, o_.stride, o_.padding, 1);
    COHORT_CHECK(oh > 0 && ow > 0, "pooling: input " << tensor::shape_string(x.shape())
                                                     << " smaller than kernel " << o_.kernel);
    p->out_shape = {x.size(0), x.size(1), oh, ow};
    p->strides = {o_.stride, o_.stride};
    p->kernel = {o_.kernel, o_.kernel};
    p->pad_l = {o_.padding, o_.padding};
    // oneDNN wants the right padding that makes the window arithmetic exact.
    p->pad_r = {(oh - 1) * o_.stride + o_.kernel - x.size(2) - o_.padding,
                (ow - 1) * o_.stride + o_.kernel - x.size(3) - o_.padding};
    auto d =
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, nhwc(x.shape()),
                                    nhwc(p->out_shape), p->strides, p->kernel, p->pad_l, p->pad_r);
    p->fwd_pd = COHORT_DNNL(dnnl::pooling_forward::primitive_desc(d, dn::engine()),
                            "pooling forward, input " << tensor::shape_string(x.shape()));
    p->fwd = dnnl::pooling_forward(p->fwd_pd);
    slot = std::move(p);
  }
  Plan& p = *slot;
  Tensor y = Tensor::empty(p.out_shape, DType::f32, Order::channels_last);
  Tensor ws;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, dn::mem(x)}, {DNNL_ARG_DST, dn::mem(y)}};
  if (kind_ == PoolKind::max) {
    ws = dn::empty_like(p.fwd_pd.workspace_desc());
    args[DNNL_ARG_WORKSPACE] = memory(p.fwd_pd.workspace_desc(), dn::engine(), ws.raw());
  }
  p.fwd.execute(dn::stream(), args);
  Var out = constant(y);
  if (recording(x_in)) {
    Plan* plan = &p;
    Tape::current()->push(out, [this, plan, alg, x_in, out, ws, xs = x.shape()]() {
      profile::Scope prof("pool.bwd");
      Plan& p = *plan;
      if (!p.has_bwd) {
        auto d = dnnl::pooling_backward::desc(alg, nhwc(xs), nhwc(p.out_shape), p.strides, p.kernel,
                                              p.pad_l, p.pad_r);
        p.bwd_pd = COHORT_DNNL(dnnl::pooling_backward::primitive_desc(d, dn::engine(), p.fwd_pd),
                               "pooling backward, input " << tensor::shape_string(xs));
        p.bwd = dnnl::pooling_backward(p.bwd_pd);
        p.has_bwd = true;
      }
      Tensor dy = grad_like_value(out);
      Tensor dx = Tensor::empty(xs, DType::f32, Order::channels_last);
      std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, dn::mem(dy)},
                                           {DNNL_ARG_DIFF_SRC, dn::mem(dx)}};
      if (kind_ == PoolKind::max) {
        args[DNNL_ARG_WORKSPACE] = memory(p.fwd_pd.workspace_desc(), dn::engine(), ws.raw());
      }
      p.bwd.execute(dn::stream(), args);
      accumulate(*x_in, std::move(dx));
    });
  }
  return out;
}

Var AdaptiveAvgPool2d::forward(const Var& x_in) {
  profile::Scope prof("avgpool.fwd");
  Tensor x = as_channels_last(x_in, "AdaptiveAvgPool2d", 0);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  COHORT_CHECK(oh_ > 0 && ow_ > 0, "AdaptiveAvgPool2d: output " << oh_ << "x" << ow_);
  Tensor y = Tensor::zeros({n, c, oh_, ow_}, DType::f32, Order::channels_last);
  const float* s = x.data<float>();
  float* d = y.data<float>();
  // Window of output i: [floor(i*H/OH), ceil((i+1)*H/OH)), as torch.
  auto lo = [](int64_t i, int64_t in, int64_t out) { return i * in / out; };
  auto hi = [](int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; };
  const int oh = oh_, ow = ow_;
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t h0 = lo(i, h, oh), h1 = hi(i, h, oh), w0 = lo(j, w, ow), w1 = hi(j, w, ow);
        float* o = d + ((b * oh + i) * ow + j) * c;
        for (int64_t y0 = h0; y0 < h1; ++y0)
          for (int64_t x0 = w0; x0 < w1; ++x0) {
            const float* px = s + ((b * h + y0) * w + x0) * c;
#pragma omp simd
            for (int64_t k = 0; k < c; ++k) o[k] += px[k];
          }
        const float inv = 1.0f / static_cast<float>((h1 - h0) * (w1 - w0));
        for (int64_t k = 0; k < c; ++k) o[k] *= inv;
      }
    }
  }
  Var out = constant(y);
  if (recording(x_in)) {
    Tape::current()->push(out, [x_in, out, n, c, h, w, oh, ow, lo, hi]() {
      profile::Scope prof("avgpool.bwd");
      Tensor dy = grad_like_value(out);
      Tensor dx = Tensor::zeros({n, c, h, w}, DType::f32, Order::channels_last);
      const float* g = dy.data<float>();
      float* r = dx.data<float>();
#pragma omp parallel for
      for (int64_t b = 0; b < n; ++b) {
        for (int64_t i = 0; i < oh; ++i) {
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t h0 = lo(i, h, oh), h1 = hi(i, h, oh), w0 = lo(j, w, ow),
                          w1 = hi(j, w, ow);
            const float inv = 1.0f / static_cast<float>((h1 - h0) * (w1 - w0));
            const float* gi = g + ((b * oh + i) * ow + j) * c;
            for (int64_t y0 = h0; y0 < h1; ++y0)
              for (int64_t x0 = w0; x0 < w1; ++x0) {
                float* px = r + ((b * h + y0) * w + x0) * c;
#pragma omp simd
                for (int64_t k = 0; k < c; ++k) px[k] += gi[k] * inv;
              }
          }
        }
      }
      accumulate(*x_in, std::move(dx));
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Flatten, Linear, Dropout, concat

Var flatten(const Var& x) {
  const Tensor& v = x->value;
  COHORT_CHECK(v.dim() >= 2, "flatten needs at least 2 dimensions");
  const int64_t n = v.size(0), rest = v.numel() / std::max<int64_t>(n, 1);
  const Shape in_shape = v.shape();
  const bool cl_trivial = v.is_channels_last() && v.size(2) == 1 && v.size(3) == 1;
  Tensor y =
      cl_trivial ? v.reinterpret({n, rest}, Order::contiguous) : v.contiguous().reshape({n, rest});
  Var out = constant(y);
  if (recording(x)) {
    Tape::current()->push(out, [x, out, in_shape, cl_trivial]() {
      Tensor g = out->grad.contiguous();
      accumulate(*x,
                 cl_trivial ? g.reinterpret(in_shape, Order::channels_last) : g.reshape(in_shape));
    });
  }
  return out;
}

Var Flatten::forward(const Var& x) {
  return flatten(x);
}

Linear::Linear(int in, int out, bool bias) : in_(in), out_(out) {
  COHORT_CHECK(in > 0 && out > 0, "Linear: in " << in << ", out " << out);
  w_ = &add_param("weight", {out, in});
  if (bias) b_ = &add_param("bias", {out}, false);
}

void Linear::reset_parameters(uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  init::uniform(w_->value, -bound, bound, seed);
  if (b_) {
    if (zero_bias) {
      b_->value.zero_();
    } else {
      init::uniform(b_->value, -bound, bound, mix64(seed ^ 0xb1a5));
    }
  }
}

Var Linear::forward(const Var& x_in) {
  profile::Scope prof("linear.fwd");
  need_value(*w_);
  if (b_) need_value(*b_);
  Tensor x = x_in->value.contiguous();
  COHORT_CHECK(x.dim() == 2 && x.size(1) == in_,
               "Linear expects [N, " << in_ << "], got " << tensor::shape_string(x.shape()));
  const int64_t n = x.size(0);
  Tensor y = Tensor::empty({n, out_});
  g_macs.fetch_add(static_cast<uint64_t>(n * in_ * out_), std::memory_order_relaxed);
  const DType ct = compute_type();
  const Tensor xc = ct == DType::f32 ? x : convert(x, ct);
  const Tensor wc = ct == DType::f32 ? w_->value : convert(w_->value, ct);  // backward reuses it
  tensor::matmul(xc, false, wc, true, y);
  if (b_) {
    const float* b = b_->value.data<float>();
    float* d = y.data<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out_; ++j) d[i * out_ + j] += b[j];
  }
  Var out = constant(y);
  if (Tape* tape = Tape::current()) {
    tape->use(*w_);
    if (b_) tape->use(*b_);
    tape->push(out, [this, tape, x_in, out, xc, wc, n, ct]() {
      profile::Scope prof("linear.bwd");
      need_value(*w_);
      // In f32 the weights are read again here, not through the forward's view: a sharded unit
      // may have been gathered into another buffer since.
      Tensor dy32 = out->grad.contiguous();
      const Tensor dy = ct == DType::f32 ? dy32 : convert(dy32, ct);
      tensor::matmul(dy, true, xc, false, w_->grad, 1.0f);
      tape->param_done(*w_);
      if (b_) {
        float* db = b_->grad.data<float>();
        const float* g = dy32.data<float>();
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < out_; ++j) db[j] += g[i * out_ + j];
        tape->param_done(*b_);
      }
      if (x_in->requires_grad) {
        Tensor dx = Tensor::empty({n, in_});
        tensor::matmul(dy, false, ct == DType::f32 ? w_->value : wc, false, dx);
        accumulate(*x_in, std::move(dx));
      }
    });
  }
  return out;
}

Var Dropout::forward(const Var& x) {
  if (!training_ || p_ <= 0.0f) return x;
  COHORT_CHECK(p_ < 1.0f, "Dropout: p " << p_);
  const Tensor& v = x->value;
  COHORT_CHECK(v.is_dense(), "Dropout needs a dense tensor");
  const Order order = v.order();
  Tensor y = Tensor::empty(v.shape(), DType::f32, order);
  Tensor mask = Tensor::empty(v.shape(), DType::u8, order);
  CounterRng rng(key3(seed_, 0xd0, calls_++));
  const float keep = 1.0f / (1.0f - p_);
  const float* s = v.data<float>();
  float* d = y.data<float>();
  uint8_t* m = mask.data<uint8_t>();
  for (int64_t i = 0; i < v.numel(); ++i) {
    m[i] = rng.uniform() >= p_;
    d[i] = m[i] ? s[i] * keep : 0.0f;
  }
  Var out = constant(y);
  if (recording(x)) {
    Tape::current()->push(out, [x, out, mask, keep, order]() {
      Tensor g = grad_like_value(out);
      Tensor dx = Tensor::empty(g.shape(), DType::f32, order);
      const uint8_t* m = mask.data<uint8_t>();
      const float* s = g.data<float>();
      float* r = dx.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) r[i] = m[i] ? s[i] * keep : 0.0f;
      accumulate(*x, std::move(dx));
    });
  }
  return out;
}

Var concat_channels(const std::vector<Var>& xs) {
  profile::Scope prof("concat.fwd");
  COHORT_CHECK(!xs.empty(), "concat of nothing");
  std::vector<Tensor> vs;
  int64_t c = 0;
  for (const Var& x : xs) {
    vs.push_back(as_channels_last(x, "concat", 0));
    COHORT_CHECK(vs.back().size(0) == vs[0].size(0) && vs.back().size(2) == vs[0].size(2) &&
                     vs.back().size(3) == vs[0].size(3),
                 "concat: " << tensor::shape_string(vs.back().shape()) << " vs "
                            << tensor::shape_string(vs[0].shape()));
    c += vs.back().size(1);
  }
  const int64_t pixels = vs[0].size(0) * vs[0].size(2) * vs[0].size(3);
  Tensor y = Tensor::empty({vs[0].size(0), c, vs[0].size(2), vs[0].size(3)}, DType::f32,
                           Order::channels_last);
  float* d = y.data<float>();
#pragma omp parallel for
  for (int64_t p = 0; p < pixels; ++p) {
    int64_t off = 0;
    for (const Tensor& v : vs) {
      const int64_t ci = v.size(1);
      std::memcpy(d + p * c + off, v.data<float>() + p * ci, ci * sizeof(float));
      off += ci;
    }
  }
  Var out = constant(y);
  bool any = false;
  for (const Var& x : xs) any |= x->requires_grad;
  if (Tape::current() && any) {
    Tape::current()->push(out, [xs, out, c, pixels]() {
      profile::Scope prof("concat.bwd");
      Tensor g = grad_like_value(out);
      const float* s = g.data<float>();
      int64_t off = 0;
      for (const Var& x : xs) {
        const int64_t ci = x->value.size(1);
        if (x->requires_grad) {
          Tensor dx = Tensor::empty(x->value.shape(), DType::f32, Order::channels_last);
          float* r = dx.data<float>();
#pragma omp parallel for
          for (int64_t p = 0; p < pixels; ++p)
            std::memcpy(r + p * ci, s + p * c + off, ci * sizeof(float));
          accumulate(*x, std::move(dx));
        }
        off += ci;
      }
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Losses

Var cross_entropy(const Var& logits, const std::vector<int>& labels, float smoothing) {
  profile::Scope prof("loss");
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
