// What nn's oneDNN layers share (one file per layer family beside this one): the usings, layout
// and type conversions, output sizes, the multiply-add count, frozen BatchNorm statistics and
// the compute type. Internal to src/nn/layers.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "cohort/core/clock.h"
#include "cohort/core/rng.h"
#include "cohort/nn/init.h"
#include "cohort/nn/layers.h"
#include "cohort/tensor/onednn.h"

namespace cohort::nn {

using dnnl::memory;
using tensor::Order;
namespace dn = tensor::onednn;

namespace layer_impl {

inline constexpr auto kF32 = memory::data_type::f32;
inline std::atomic<uint64_t> g_macs{0};           // forward_macs()
inline thread_local bool g_frozen_stats = false;  // FrozenBatchNormStatistics

// A layer's boundary: its input on its parameters' device (an error naming both), and, as these
// layers run on the CPU (oneDNN and host loops), in host memory (the GPU layers are issue 36's).
inline void check_device(const char* layer, const Tensor& x, const Tensor* weight = nullptr) {
  if (weight && weight->defined())
    tensor::require_same_device(layer, "input", x, "weight", *weight);
  tensor::require_host(x, layer);
}

inline Tensor as_channels_last(const Var& x, const char* layer, int channels) {
  const Tensor& t = x->value;
  check_device(layer, t);
  COHORT_CHECK(t.dim() == 4,
               layer << " needs a 4-d [N, C, H, W] input, got " << tensor::shape_string(t.shape()));
  COHORT_CHECK(channels <= 0 || t.size(1) == channels,
               layer << " expects " << channels << " input channels, got " << t.size(1)
                     << " (input " << tensor::shape_string(t.shape()) << ")");
  return t.is_channels_last() ? t : t.channels_last();
}

// The gradient that arrived for `out`, in the layout of out's value (a copy only if it differs).
inline Tensor grad_like_value(const Var& out) {
  return out->grad.strides() == out->value.strides() ? out->grad
                                                     : out->grad.clone(out->value.order());
}

inline memory::desc nhwc(const Shape& s, memory::data_type t = kF32) {
  return memory::desc(dn::dims(s), t, memory::format_tag::nhwc);
}

// The same values in another type and the same layout, by a oneDNN reorder.
inline Tensor convert(const Tensor& t, DType to) {
  Tensor out = Tensor::empty(t.shape(), to, t.order());
  dn::reorder(dn::mem(t), dn::mem(out));
  return out;
}

inline DType g_compute = DType::f32;  // set_compute_type()

inline memory::desc vec(int64_t n) {
  return memory::desc({n}, kF32, memory::format_tag::a);
}

// Reorders when oneDNN wants another layout; otherwise uses the tensor's memory as it is. The
// reordered copy lives in `scratch`, taken from the caching allocator for this call only: kept
// per layer, such copies would cost a second and third copy of every weight.
inline memory as_layout(const memory& user, const memory::desc& want, Tensor* scratch) {
  if (user.get_desc() == want) return user;
  *scratch = dn::empty_like(want);
  memory m(want, dn::engine(), scratch->raw());
  dn::reorder(user, m);
  return m;
}

inline int64_t out_size(int64_t in, int k, int s, int p, int d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

}  // namespace layer_impl
}  // namespace cohort::nn
