// How far apart two runs' tensors are: the largest elementwise difference relative to the
// reference, with values below 1e-2 compared as 1e-2 (so that near-zeros do not dominate).
#pragma once

#include <algorithm>
#include <cmath>

#include "cohort/tensor/tensor.h"

namespace cohort::testing {

inline double max_rel_diff(const tensor::Tensor& got, const tensor::Tensor& ref) {
  double worst = 0;
  const float* p = got.data<float>();
  const float* q = ref.data<float>();
  for (int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst, std::abs(p[i] - q[i]) / std::max(1e-2, std::abs(double{q[i]})));
  }
  return worst;
}

}  // namespace cohort::testing
