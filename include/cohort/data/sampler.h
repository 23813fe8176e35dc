// DistributedSampler semantics: every rank draws the same permutation from (seed, epoch); rank
// r takes global positions r, r + world, ...; the order is padded (repeating its start) or cut
// (drop_last) so every rank has the same count. Positions are global, so a run can resume from
// any (epoch, global position), with any world size, and continue the same global sequence.
// With `groups` g > 1 a rank stands in for g ranks of a world g times larger (ranks g*r ..
// g*r+g-1), taking one batch of each in turn: a run restarted on fewer ranks with g times the
// accumulation then sees the very micro-batches of the larger world, step by step.
// A range [from, to) of positions is dealt the same way from `from` (rank r: from + r, from + r
// + world, ... below `to`), so ranks may get different counts, or none: a resume that does not
// fall on the new layout's batches trains its leftover samples so (docs/training.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cohort::data {

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  int groups = 1;    // ranks of the larger world this rank stands in for
  size_t batch = 0;  // their batch (needed when groups > 1)
};

class Sampler {
 public:
  Sampler(size_t dataset_size, int world, int rank, SamplerOptions opt = {});

  // Global order of one epoch after padding or cutting: length total_size().
  std::vector<size_t> global_order(uint64_t epoch) const;
  // This rank's dataset indices for the epoch, starting at global position `from` (a multiple
  // of nothing in particular: positions before it are skipped on every rank). With a `to` (at
  // most the epoch's end), only positions [from, to), without padding (groups must be 1).
  std::vector<size_t> indices(uint64_t epoch, size_t from = 0, size_t to = SIZE_MAX) const;
  // How many of positions [from, to) this rank takes (what indices(e, from, to) returns).
  size_t count_in(size_t from, size_t to) const;

  size_t total_size() const { return total_; }         // per epoch, all ranks
  size_t per_rank() const { return total_ / world_; }  // samples per rank per epoch
  int world() const { return world_; }
  int rank() const { return rank_; }

 private:
  size_t n_;
  int world_, rank_;
  SamplerOptions opt_;
  size_t total_;
};

}  // namespace cohort::data
