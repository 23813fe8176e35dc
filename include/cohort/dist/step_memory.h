// What a step allocates beyond the persistent state (activations, the tape's temporaries, the
// backward's scratch): the tensor allocator's peak over the step minus what was in use when the
// step began; and what the allocator's cache holds beyond that peak (blocks of other sizes kept
// for reuse), so that the two never count the same bytes. Shared by DDP and the sharded engine.
#pragma once

#include <algorithm>

#include "cohort/tensor/tensor.h"

namespace cohort::dist {

class StepMemory {
 public:
  void begin() {
    tensor::Allocator::cpu().reset_peak();
    base_ = tensor::Allocator::cpu().stats().in_use;
  }
  void end() {
    const tensor::AllocatorStats s = tensor::Allocator::cpu().stats();
    peak_ = std::max(peak_, s.peak_in_use > base_ ? s.peak_in_use - base_ : 0);
    const size_t footprint = s.in_use + s.cached;
    cache_ = std::max(cache_, footprint > s.peak_in_use ? footprint - s.peak_in_use : 0);
  }
  size_t peak() const { return peak_; }
  size_t cache() const { return cache_; }

 private:
  size_t base_ = 0, peak_ = 0, cache_ = 0;
};

}  // namespace cohort::dist
