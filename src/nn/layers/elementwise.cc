// The elementwise layers and ops: ReLU, the residual add (with its ReLU), flatten, Dropout and
// the channel concat (DenseNet).
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

// ---------------------------------------------------------------------------------------------
// Elementwise

Var relu(const Var& x) {
  profile::Scope prof("relu.fwd");
  const Tensor& xv = x->value;
  check_device("relu", xv);
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
  tensor::require_same_device("add", "first operand", av, "second operand", bv);
  check_device("add", av);
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

}  // namespace cohort::nn
