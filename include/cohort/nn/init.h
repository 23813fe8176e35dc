// Parameter initialisation from counter-based draws: a parameter's values depend only on the
// model seed and the parameter, never on thread count or creation order elsewhere.
#pragma once

#include <cstdint>

#include "cohort/tensor/tensor.h"

namespace cohort::nn::init {

void normal(tensor::Tensor& t, double mean, double stddev, uint64_t seed);
void uniform(tensor::Tensor& t, double lo, double hi, uint64_t seed);

}  // namespace cohort::nn::init
