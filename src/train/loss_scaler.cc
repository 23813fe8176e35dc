// Dynamic loss scaling (see loss_scaler.h).
#include "cohort/train/loss_scaler.h"

namespace cohort::train {

LossScaler::LossScaler(bool enabled, float initial_scale, int growth_interval)
    : enabled_(enabled),
      scale_(enabled ? initial_scale : 1.0f),
      growth_interval_(growth_interval) {}

bool LossScaler::unscale(tensor::Tensor& flat_grads) {
  if (!enabled_) return true;
  // A scaled gradient beyond f16's largest value counts as an overflow even where the kernels
  // fell back to f32, so that the scale settles where f16 would hold it.
  if (!(tensor::max_abs(flat_grads) <= 65504.0)) {
    ++skipped_;
    scale_ /= 2;
    good_steps_ = 0;
    return false;
  }
  tensor::scale_(flat_grads, 1.0f / scale_);
  if (++good_steps_ == growth_interval_) {
    scale_ *= 2;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace cohort::train
