// Dynamic loss scaling for f16 training (as PyTorch's GradScaler): backward runs on the loss
// times scale(); afterwards the averaged gradients are checked. A value beyond f16's largest
// (65504), inf or NaN means overflow: the step is skipped and the scale halved. Otherwise the
// gradients are divided back in place, and after `growth_interval` good steps in a row the scale
// doubles. Disabled (f32 and bf16), the scale is 1 and every step applies.
#pragma once

#include <cstdint>

#include "cohort/nn/optim.h"

namespace cohort::train {

class LossScaler {
 public:
  LossScaler(bool enabled, float initial_scale, int growth_interval = 2000);

  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }
  // After backward (and DDP's averaging): true when the optimiser step may apply, with the
  // gradients unscaled; false on overflow (the step is to be skipped; the scale is halved).
  // The gradients are the optimiser's (a rank's shards under ZeRO): an overflow on any rank is
  // summed over the ranks, so that every rank decides alike.
  bool unscale(const nn::OptimTarget& grads);
  int64_t skipped_steps() const { return skipped_; }

 private:
  bool enabled_;
  float scale_;
  int growth_interval_;
  int good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cohort::train
