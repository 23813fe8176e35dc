#include "cohort/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cohort/core/error.h"

using namespace cohort::data;

TEST(Sampler, RanksAreDisjointCompleteAndEqual) {
  for (size_t n : {1, 7, 10, 97, 1000}) {
    for (int world : {1, 2, 3, 8}) {
      std::multiset<size_t> all;
      size_t per = 0;
      for (int r = 0; r < world; ++r) {
        Sampler s(n, world, r, {42, true, false});
        auto mine = s.indices(3);
        if (r == 0) per = mine.size();
        EXPECT_EQ(mine.size(), per) << "n " << n << " world " << world;
        all.insert(mine.begin(), mine.end());
      }
      std::set<size_t> distinct(all.begin(), all.end());
      EXPECT_EQ(distinct.size(), n) << "every sample is drawn";
      EXPECT_EQ(all.size(), (n + world - 1) / world * world) << "padding only to a multiple";
    }
  }
}

TEST(Sampler, DropLastCutsInsteadOfPadding) {
  Sampler s(10, 3, 0, {1, true, true});
  EXPECT_EQ(s.total_size(), 9u);
  std::set<size_t> seen;
  for (int r = 0; r < 3; ++r) {
    for (size_t i : Sampler(10, 3, r, {1, true, true}).indices(0))
      EXPECT_TRUE(seen.insert(i).second);
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(Sampler, SamePermutationOnEveryRankNewOneEachEpoch) {
  Sampler a(100, 4, 0, {5}), b(100, 4, 3, {5});
  EXPECT_EQ(a.global_order(2), b.global_order(2));
  EXPECT_NE(a.global_order(2), a.global_order(3));
  EXPECT_NE(a.global_order(2), Sampler(100, 4, 0, {6}).global_order(2));
  auto unshuffled = Sampler(10, 1, 0, {5, false}).global_order(0);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(unshuffled[i], i);
}

TEST(Sampler, ResumeContinuesTheGlobalSequenceWithAnyWorldSize) {
  const size_t n = 103;
  const auto order = Sampler(n, 1, 0, {9}).global_order(4);
  for (size_t from : {0, 10, 64, 102, 103}) {
    for (int world : {1, 2, 4}) {
      // Interleave the ranks' sequences: they must continue the global order from `from`.
      std::vector<std::vector<size_t>> parts;
      for (int r = 0; r < world; ++r) parts.push_back(Sampler(n, world, r, {9}).indices(4, from));
      std::vector<size_t> merged;
      for (size_t k = 0; k < parts[0].size(); ++k) {
        for (int r = 0; r < world; ++r) merged.push_back(parts[static_cast<size_t>(r)][k]);
      }
      // Every position from `from` to the epoch's end is dealt exactly once, in order; a last
      // round the world size does not fill is padded from the epoch's start.
      Sampler s(n, world, 0, {9});
      const size_t total = s.total_size(), w = static_cast<size_t>(world);
      const size_t rounds = (total - from + w - 1) / w;
      ASSERT_EQ(merged.size(), rounds * w) << "from " << from << " world " << world;
      ASSERT_GE(merged.size(), total - from);
      const auto global = s.global_order(4);
      for (size_t k = 0; k < merged.size(); ++k) {
        const size_t p = from + k;
        EXPECT_EQ(merged[k], global[p < total ? p : p - total])
            << "from " << from << " world " << world << " position " << p;
      }
      if (world == 1) {
        ASSERT_EQ(merged.size(), n - from);
        EXPECT_TRUE(
            std::equal(merged.begin(), merged.end(), order.begin() + static_cast<long>(from)));
      }
    }
  }
  EXPECT_THROW(Sampler(10, 1, 0).indices(0, 11), cohort::Error);
}

// A run restarted on 2 ranks with twice the accumulation stands each rank in for 2 ranks of the
// old 4-rank world: step by step, its micro-batches are the old ranks' batches, from the start
// of the epoch and from a resume position.
TEST(Sampler, GroupsReplayTheBatchesOfALargerWorld) {
  const size_t n = 100, batch = 3;
  for (size_t from : {size_t{0}, size_t{24}}) {
    std::vector<std::vector<size_t>> old(4);
    for (int r = 0; r < 4; ++r) old[r] = Sampler(n, 4, r, {7, true, false}).indices(2, from);
    for (int r = 0; r < 2; ++r) {
      const auto mine = Sampler(n, 2, r, {7, true, false, 2, batch}).indices(2, from);
      ASSERT_EQ(mine.size(), old[2 * r].size() + old[2 * r + 1].size()) << "from " << from;
      size_t at = 0;
      for (size_t c = 0; c * batch < old[0].size(); ++c) {
        for (int k = 0; k < 2; ++k) {
          const auto& o = old[2 * r + k];
          for (size_t t = c * batch; t < std::min(o.size(), (c + 1) * batch); ++t) {
            EXPECT_EQ(mine[at++], o[t]) << "rank " << r << " batch " << c << " of old rank "
                                        << 2 * r + k << ", from " << from;
          }
        }
      }
    }
    EXPECT_EQ(Sampler(n, 2, 0, {7, true, false, 2, batch}).per_rank(),
              2 * Sampler(n, 4, 0, {7, true, false}).per_rank());
  }
}

// A resume's leftover, positions [from, to), is dealt over the ranks from `from`: ranks may get
// one sample fewer than rank 0, or none, and together they take each position once, in order.
TEST(Sampler, ARangeIsDealtFromItsStartWithoutPadding) {
  const size_t n = 72;
  const auto global = Sampler(n, 1, 0, {9}).global_order(1);
  for (int world : {1, 2, 3, 4}) {
    for (auto [from, to] :
         {std::pair<size_t, size_t>{8, 12}, {10, 12}, {32, 36}, {70, 72}, {5, 5}, {0, 71}}) {
      std::vector<std::vector<size_t>> parts;
      for (int r = 0; r < world; ++r) {
        Sampler s(n, world, r, {9});
        parts.push_back(s.indices(1, from, to));
        EXPECT_EQ(parts.back().size(), s.count_in(from, to)) << "rank " << r;
      }
      std::vector<size_t> merged;
      for (size_t k = 0; k < parts[0].size(); ++k) {
        for (int r = 0; r < world; ++r)
          if (k < parts[static_cast<size_t>(r)].size()) merged.push_back(parts[r][k]);
      }
      ASSERT_EQ(merged.size(), to - from) << "world " << world << " [" << from << ", " << to << ")";
      EXPECT_TRUE(
          std::equal(merged.begin(), merged.end(), global.begin() + static_cast<long>(from)))
          << "world " << world << " [" << from << ", " << to << ")";
    }
  }
  // 2 positions over 3 ranks: 1, 1 and none.
  EXPECT_EQ(Sampler(n, 3, 0, {9}).count_in(10, 12), 1u);
  EXPECT_EQ(Sampler(n, 3, 1, {9}).count_in(10, 12), 1u);
  EXPECT_EQ(Sampler(n, 3, 2, {9}).count_in(10, 12), 0u);
  EXPECT_TRUE(Sampler(n, 3, 2, {9}).indices(0, 10, 12).empty());
  // Groups stand in for a larger world's batches: a range is not theirs to deal.
  EXPECT_THROW(Sampler(n, 2, 0, {9, true, false, 2, 3}).indices(0, 8, 12), cohort::Error);
}
