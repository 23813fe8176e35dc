// Tensors of normal(0, 1) values for the layer and model tests, in the layout asked for.
#pragma once

#include <cstdint>

#include "cohort/nn/init.h"
#include "cohort/tensor/tensor.h"

namespace cohort::testing {

inline tensor::Tensor random_tensor(const tensor::Shape& s, uint64_t seed,
                                    tensor::Order order = tensor::Order::contiguous) {
  tensor::Tensor t = tensor::Tensor::empty(s, tensor::DType::f32, tensor::Order::contiguous);
  nn::init::normal(t, 0.0, 1.0, seed);
  return order == tensor::Order::contiguous ? t : t.clone(order);
}

}  // namespace cohort::testing
