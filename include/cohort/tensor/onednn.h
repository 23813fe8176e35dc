// The bridge to oneDNN: one CPU engine and stream per process, tensors described as oneDNN
// memory (their own strides, so channels-last tensors need no reorder), and primitive
// creation that names the shapes when oneDNN refuses them.
#pragma once

#include <dnnl.hpp>

#include "cohort/tensor/tensor.h"

namespace cohort::tensor::onednn {

dnnl::engine& engine();
dnnl::stream& stream();

dnnl::memory::data_type dt(DType t);
dnnl::memory::dims dims(const Shape& s);
// The tensor's own layout (its strides).
dnnl::memory::desc desc(const Tensor& t);
dnnl::memory mem(const Tensor& t);
// A new tensor laid out as oneDNN wants `d` (blocked formats included; its logical shape is
// d's dims, and only oneDNN reads it).
Tensor empty_like(const dnnl::memory::desc& d);
dnnl::memory mem(const Tensor& t, const dnnl::memory::desc& d);

// Reorders src into dst's layout; with accumulate, dst += src (a sum post-op).
void reorder(const dnnl::memory& src, const dnnl::memory& dst, bool accumulate = false);

}  // namespace cohort::tensor::onednn

// Wraps a oneDNN call so that its status becomes a cohort::Error with file:line and context.
#define COHORT_DNNL(expr, ...)                                                                     \
  [&]() {                                                                                          \
    try {                                                                                          \
      return expr;                                                                                 \
    } catch (const dnnl::error& e__) {                                                             \
      COHORT_THROW("oneDNN: " << e__.what() << " (status " << e__.status << "): " << __VA_ARGS__); \
    }                                                                                              \
  }()
