// What the tests labelled `gpu` share: the device they run on, and test values that go to it and
// come back. A gpu test needs a GPU: without one it fails, naming why (scripts/test leaves the
// label out where there is no device, and says how many it left).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/core/half.h"
#include "cohort/tensor/tensor.h"

namespace cohort::testing {

// Fails the test unless a CUDA device is usable, and makes device 0 this process's.
#define COHORT_REQUIRE_GPU()                                                                 \
  do {                                                                                       \
    ASSERT_GT(::cohort::cuda::device_count(), 0)                                             \
        << ::cohort::cuda::unavailable_reason()                                              \
        << ": this test needs a GPU; scripts/test leaves the `gpu` label out where none is"; \
    if (!::cohort::cuda::device_chosen()) ::cohort::cuda::use_device(0, "the gpu test");     \
  } while (0)

// n values in [-1, 1) from `seed`; rounded to bf16 first when `bf16` (so that both sides of a
// comparison start from the same inputs).
inline std::vector<float> gpu_test_values(size_t n, uint32_t seed, bool bf16) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / (1 << 23) - 1.0f;
    if (bf16) x = bf16_to_f32(f32_to_bf16(x));
  }
  return v;
}

// Logical-order values as a device tensor of `type` in `order`.
inline tensor::Tensor to_gpu(const std::vector<float>& v, const tensor::Shape& s,
                             tensor::Order order, tensor::DType type) {
  tensor::Tensor host = tensor::Tensor::wrap(const_cast<float*>(v.data()), s, tensor::DType::f32);
  tensor::Tensor typed = tensor::Tensor::empty(s, type, order);
  typed.copy_(host);
  return typed.to(tensor::Device::cuda);
}

// A device tensor's values in logical order, as f32.
inline std::vector<float> from_gpu(const tensor::Tensor& t) {
  tensor::Tensor host = t.to(tensor::Device::cpu);
  tensor::Tensor f = tensor::Tensor::empty(t.shape(), tensor::DType::f32);
  f.copy_(host);
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

}  // namespace cohort::testing
