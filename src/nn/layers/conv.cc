// Conv2d on oneDNN: forward, backward-data and backward-weights, primitives cached per input
// shape and compute type.
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

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
  tensor::require_same_device("Conv2d", "input", x_in->value, "weight", w_->value);
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

}  // namespace cohort::nn
