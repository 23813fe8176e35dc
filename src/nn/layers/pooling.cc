// Max and average pooling on oneDNN, and the adaptive average pool.
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

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

}  // namespace cohort::nn
