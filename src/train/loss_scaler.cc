// Dynamic loss scaling (see loss_scaler.h).
#include "cohort/train/loss_scaler.h"

namespace cohort::train {

LossScaler::LossScaler(bool enabled, float initial_scale, int growth_interval)
    : enabled_(enabled),
      scale_(enabled ? initial_scale : 1.0f),
      growth_interval_(growth_interval) {}

bool LossScaler::unscale(const nn::OptimTarget& grads) {
  if (!enabled_) return true;
  // A scaled gradient beyond f16's largest value counts as an overflow even where the kernels
  // fell back to f32, so that the scale settles where f16 would hold it.
  auto range = [](const nn::FlatRange& r) {
    return tensor::Tensor::wrap(r.g, {static_cast<int64_t>(r.n)}, tensor::DType::f32);
  };
  double overflowing = 0;  // ranges with an overflow
  for (const nn::FlatRange& r : grads.ranges) {
    if (!(tensor::max_abs(range(r)) <= 65504.0)) overflowing += 1;
  }
  if (grads.sum_across) grads.sum_across(&overflowing, 1);
  if (overflowing > 0) {
    ++skipped_;
    scale_ /= 2;
    good_steps_ = 0;
    return false;
  }
  for (const nn::FlatRange& r : grads.ranges) {
    tensor::Tensor g = range(r);
    tensor::scale_(g, 1.0f / scale_);
  }
  if (++good_steps_ == growth_interval_) {
    scale_ *= 2;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace cohort::train
