// DistributedSampler and shard_indices: PyTorch's partition properties for
// W = 1..4 and sizes that do and do not divide by W.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "comm/check.hpp"
#include "io/sampler.hpp"

using ddp::DistributedSampler;

namespace {
const std::int64_t kSizes[] = {0, 1, 2, 3, 7, 10, 12, 97, 1000};

std::map<std::int64_t, int> counts_over_ranks(std::int64_t n, int w, bool shuffle, bool drop_last,
                                              std::int64_t epoch) {
  std::map<std::int64_t, int> counts;
  for (int r = 0; r < w; ++r) {
    DistributedSampler s(n, w, r, shuffle, 42, drop_last);
    s.set_epoch(epoch);
    const auto idx = s.indices();
    EXPECT_EQ(std::int64_t(idx.size()), s.num_samples()) << "n=" << n << " w=" << w << " r=" << r;
    for (auto i : idx) {
      EXPECT_GE(i, 0);
      EXPECT_LT(i, n);
      ++counts[i];
    }
  }
  return counts;
}
}  // namespace

TEST(Sampler, SizesFollowTorch) {
  EXPECT_EQ(DistributedSampler(10, 3, 0, true, 0, false).num_samples(), 4);
  EXPECT_EQ(DistributedSampler(10, 3, 0, true, 0, false).total_size(), 12);
  EXPECT_EQ(DistributedSampler(10, 3, 2, true, 0, true).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(10, 3, 2, true, 0, true).total_size(), 9);
  EXPECT_EQ(DistributedSampler(12, 4, 1, true, 0, true).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(1, 4, 3, true, 0, false).num_samples(), 1);
  EXPECT_EQ(DistributedSampler(1, 4, 3, true, 0, true).num_samples(), 0);
}

TEST(Sampler, PaddingCoversEverySampleWithOnlyPaddingDuplicates) {
  for (int w = 1; w <= 4; ++w)
    for (auto n : kSizes)
      for (bool shuffle : {true, false}) {
        DistributedSampler s(n, w, 0, shuffle, 42, false);
        const auto counts = counts_over_ranks(n, w, shuffle, false, 3);
        EXPECT_EQ(std::int64_t(counts.size()), n) << "every sample appears, n=" << n << " w=" << w;
        std::int64_t extra = 0;
        for (const auto& [i, c] : counts) extra += c - 1;
        EXPECT_EQ(extra, s.total_size() - n) << "n=" << n << " w=" << w;
        EXPECT_LT(s.total_size() - n, std::max<std::int64_t>(w, 1)) << "at most W-1 pads";
      }
}

TEST(Sampler, DropLastIsDisjoint) {
  for (int w = 1; w <= 4; ++w)
    for (auto n : kSizes) {
      DistributedSampler s(n, w, 0, true, 42, true);
      const auto counts = counts_over_ranks(n, w, true, true, 5);
      EXPECT_EQ(std::int64_t(counts.size()), s.total_size()) << "n=" << n << " w=" << w;
      for (const auto& [i, c] : counts) EXPECT_EQ(c, 1) << "sample " << i << " n=" << n;
      EXPECT_EQ(s.total_size(), n / w * w);
    }
}

TEST(Sampler, RankTakesEveryWthOfTheGlobalOrder) {
  for (int w = 1; w <= 4; ++w)
    for (int r = 0; r < w; ++r) {
      DistributedSampler s(23, w, r, true, 9, false);
      s.set_epoch(2);
      const auto g = s.global_order();
      const auto mine = s.indices();
      ASSERT_EQ(std::int64_t(g.size()), s.total_size());
      for (std::size_t j = 0; j < mine.size(); ++j) EXPECT_EQ(mine[j], g[r + j * w]);
    }
}

TEST(Sampler, PadsByRepeatingFromTheStart) {
  DistributedSampler s(10, 4, 0, true, 1, false);  // total 12: two pads
  const auto g = s.global_order();
  ASSERT_EQ(g.size(), 12u);
  EXPECT_EQ(g[10], g[0]);
  EXPECT_EQ(g[11], g[1]);
  DistributedSampler tiny(1, 4, 0, true, 1, false);  // padding longer than the data
  EXPECT_EQ(tiny.global_order(), (std::vector<std::int64_t>{0, 0, 0, 0}));
}

TEST(Sampler, DeterministicPerSeedAndEpochDifferentAcrossEpochs) {
  DistributedSampler a(1000, 3, 1, true, 7, false), b(1000, 3, 1, true, 7, false);
  a.set_epoch(4);
  b.set_epoch(4);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(5);
  EXPECT_NE(a.indices(), b.indices());
  DistributedSampler c(1000, 3, 1, true, 8, false);
  c.set_epoch(4);
  EXPECT_NE(a.indices(), c.indices());
  // Shuffled means not the identity, and a permutation.
  auto g = a.global_order();
  g.resize(1000);
  std::vector<std::int64_t> id(1000);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_NE(g, id);
  std::sort(g.begin(), g.end());
  EXPECT_EQ(g, id);
}

TEST(Sampler, PortablePermutation) {
  // Pinned values: any change of generator or bounded draw breaks resumability
  // of runs across builds, so it must be deliberate.
  const auto p = ddp::seeded_permutation(10, 0);
  std::vector<std::int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p, ddp::seeded_permutation(10, 0));
  EXPECT_EQ(p, (std::vector<std::int64_t>{7, 2, 0, 8, 3, 9, 6, 1, 5, 4}));
}

TEST(Sampler, NoShuffleIsIdentity) {
  DistributedSampler s(10, 3, 1, false, 123, false);
  s.set_epoch(7);
  EXPECT_EQ(s.global_order(), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));
  EXPECT_EQ(s.indices(), (std::vector<std::int64_t>{1, 4, 7, 0}));
}

TEST(Sampler, BadRankThrows) {
  EXPECT_THROW(DistributedSampler(10, 0, 0, true, 0, false), ddp::InputError);
  EXPECT_THROW(DistributedSampler(10, 2, 2, true, 0, false), ddp::InputError);
  EXPECT_THROW(ddp::shard_indices(10, 2, -1), ddp::InputError);
}

TEST(ShardIndices, DisjointAndComplete) {
  for (int w = 1; w <= 4; ++w)
    for (auto n : kSizes) {
      std::vector<int> seen(std::size_t(n), 0);
      std::int64_t max_len = 0, min_len = n;
      for (int r = 0; r < w; ++r) {
        const auto idx = ddp::shard_indices(n, w, r);
        max_len = std::max<std::int64_t>(max_len, idx.size());
        min_len = std::min<std::int64_t>(min_len, idx.size());
        for (auto i : idx) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          ++seen[i];
        }
      }
      for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "n=" << n << " w=" << w;
      EXPECT_LE(max_len - min_len, 1) << "balanced, n=" << n << " w=" << w;
    }
}
