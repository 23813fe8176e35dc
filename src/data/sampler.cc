#include "cohort/data/sampler.h"

#include <algorithm>
#include <numeric>

#include "cohort/core/error.h"
#include "cohort/core/rng.h"

namespace cohort::data {

Sampler::Sampler(size_t dataset_size, int world, int rank, SamplerOptions opt)
    : n_(dataset_size), world_(world), rank_(rank), opt_(opt) {
  COHORT_CHECK(world >= 1 && rank >= 0 && rank < world, "rank " << rank << " of world " << world);
  COHORT_CHECK(dataset_size > 0, "the data set is empty");
  COHORT_CHECK(opt_.groups >= 1 && (opt_.groups == 1 || opt_.batch > 0),
               "sampler groups " << opt_.groups << " with batch " << opt_.batch);
  const size_t w = static_cast<size_t>(world) * static_cast<size_t>(opt_.groups);
  if (opt_.drop_last) {
    total_ = n_ / w * w;
    COHORT_CHECK(total_ > 0,
                 "drop_last with " << n_ << " samples and " << world << " ranks leaves nothing");
  } else {
    total_ = (n_ + w - 1) / w * w;
  }
}

std::vector<size_t> Sampler::global_order(uint64_t epoch) const {
  std::vector<size_t> order(n_);
  std::iota(order.begin(), order.end(), size_t{0});
  if (opt_.shuffle) {  // Fisher-Yates driven by a generator keyed on (seed, epoch)
    CounterRng rng(key3(opt_.seed, epoch, 0x5a3b1e));
    for (size_t i = n_; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  order.resize(total_);                                           // cut (drop_last) ...
  for (size_t i = n_; i < total_; ++i) order[i] = order[i - n_];  // ... or pad from the start
  return order;
}

size_t Sampler::count_in(size_t from, size_t to) const {
  to = std::min(to, total_);
  const size_t r = static_cast<size_t>(rank_), w = static_cast<size_t>(world_);
  return to > from + r ? (to - from - r - 1) / w + 1 : 0;
}

std::vector<size_t> Sampler::indices(uint64_t epoch, size_t from, size_t to) const {
  COHORT_CHECK(from <= total_,
               "resume position " << from << " is past the epoch's " << total_ << " samples");
  std::vector<size_t> order = global_order(epoch);
  if (to != SIZE_MAX) {
    COHORT_CHECK(from <= to && to <= total_, "positions [" << from << ", " << to
                                                           << ") are not within the epoch's "
                                                           << total_ << " samples");
    COHORT_CHECK(opt_.groups == 1, "a range of positions [" << from << ", " << to
                                                            << ") with sampler groups "
                                                            << opt_.groups);
    std::vector<size_t> mine;
    mine.reserve(count_in(from, to));
    for (size_t p = from + static_cast<size_t>(rank_); p < to; p += static_cast<size_t>(world_))
      mine.push_back(order[p]);
    return mine;
  }
  if (opt_.groups > 1) {
    // Virtual rank v = g*rank + k takes positions from + v + V*t; batch c of each in turn.
    const size_t g = static_cast<size_t>(opt_.groups), V = static_cast<size_t>(world_) * g;
    const size_t per_virtual = (total_ - from + V - 1) / V, b = opt_.batch;
    std::vector<size_t> mine;
    mine.reserve(per_virtual * g);
    for (size_t c = 0; c * b < per_virtual; ++c) {
      for (size_t k = 0; k < g; ++k) {
        const size_t v = static_cast<size_t>(rank_) * g + k;
        for (size_t t = c * b; t < std::min(per_virtual, (c + 1) * b); ++t) {
          const size_t p = from + v + V * t;
          mine.push_back(order[p < total_ ? p : p - total_]);
        }
      }
    }
    return mine;
  }
  const size_t w = static_cast<size_t>(world_);
  // Positions are dealt round-robin from `from`; a remainder that does not divide by the world
  // size (after a resume with another world size) is padded from the epoch's start.
  const size_t rounds = (total_ - from + w - 1) / w;
  std::vector<size_t> mine;
  mine.reserve(rounds);
  for (size_t k = 0; k < rounds; ++k) {
    size_t p = from + k * w + static_cast<size_t>(rank_);
    mine.push_back(order[p < total_ ? p : p - total_]);
  }
  return mine;
}

}  // namespace cohort::data
