// Linear on oneDNN's matmul, with the bias.
#include "onednn_common.h"

namespace cohort::nn {

using namespace layer_impl;

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
  check_device("Linear", x_in->value, &w_->value);
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

}  // namespace cohort::nn
