#include "cohort/nn/init.h"

#include <cmath>

#include "cohort/core/rng.h"

namespace cohort::nn::init {

void normal(tensor::Tensor& t, double mean, double stddev, uint64_t seed) {
  COHORT_CHECK(t.dtype() == tensor::DType::f32 && t.is_dense(), "init::normal needs dense f32");
  CounterRng rng(seed);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  // Box-Muller, two values per pair of draws.
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    p[i] = static_cast<float>(mean + stddev * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) p[i + 1] = static_cast<float>(mean + stddev * r * std::sin(2 * M_PI * u2));
  }
}

void uniform(tensor::Tensor& t, double lo, double hi, uint64_t seed) {
  COHORT_CHECK(t.dtype() == tensor::DType::f32 && t.is_dense(), "init::uniform needs dense f32");
  CounterRng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.uniform(lo, hi));
}

}  // namespace cohort::nn::init
