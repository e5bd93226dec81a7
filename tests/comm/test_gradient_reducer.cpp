// Bucketed, overlapped gradient all-reduce: bucket planning and the sums it
// produces, for both ways of making MPI progress and through shared memory.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "comm/gradient_reducer.hpp"
#include "comm/shm_reducer.hpp"

namespace {

using ddp::Bucket;
using ddp::GradientReducer;
using Tensors = std::vector<std::pair<std::int64_t, std::int64_t>>;

Tensors layout(const std::vector<std::int64_t>& sizes) {
  Tensors t;
  std::int64_t off = 0;
  for (auto s : sizes) t.push_back({off, s}), off += s;
  return t;
}

constexpr double kFloatsPerMb = 1024.0 * 1024.0 / 4.0;

TEST(PlanBuckets, ReverseOrderWholeTensorsSmallFirstBucket) {
  // Sizes in floats; caps: first bucket 100 floats, then 300.
  const Tensors t = layout({500, 50, 200, 60, 60, 40, 10});
  const auto b = ddp::plan_buckets(t, 300 / kFloatsPerMb, 100 / kFloatsPerMb);
  // From the end: 10+40+60 = 110 >= 100 closes the first; 60+200+50 = 310 >= 300; 500 alone.
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, 810);
  EXPECT_EQ(b[0].end, 920);
  EXPECT_EQ(b[1].begin, 500);
  EXPECT_EQ(b[1].end, 810);
  EXPECT_EQ(b[2].begin, 0);
  EXPECT_EQ(b[2].end, 500);
}

TEST(PlanBuckets, CoverTheBufferWithoutGapsAndSkipEmptyTensors) {
  const Tensors t = layout({7, 0, 1000, 3, 0, 250, 9, 4000, 1});
  const auto b = ddp::plan_buckets(t, 1000 / kFloatsPerMb, 10 / kFloatsPerMb);
  std::int64_t expect_end = 7 + 1000 + 3 + 250 + 9 + 4000 + 1;
  for (const Bucket& k : b) {
    EXPECT_EQ(k.end, expect_end);
    EXPECT_LT(k.begin, k.end);
    expect_end = k.begin;
  }
  EXPECT_EQ(expect_end, 0);
}

const Tensors kTensors = layout({3000, 300, 30000, 700, 5, 12000, 40});

// Each rank holds grads[i] = (rank + 1) * (i % 97) + step: the sums are exact in
// float. `grads` is where the reducer reads and leaves them.
void check_reduction(ddp::BucketReducer& reducer, float* grads) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Tensors& t = kTensors;
  const std::int64_t n = t.back().first + t.back().second;
  ASSERT_EQ(reducer.buckets().size(), 4u);
  const float ranks_sum = float(size * (size + 1) / 2);
  for (int step = 0; step < 3; ++step) {
    // "Backward": tensors become final from the last to the first.
    for (auto it = t.rbegin(); it != t.rend(); ++it) {
      for (std::int64_t i = it->first; i < it->first + it->second; ++i)
        grads[std::size_t(i)] = float((rank + 1) * (i % 97) + step);
      reducer.mark_ready(it->first);
    }
    reducer.finish();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i)
      wrong += grads[std::size_t(i)] != ranks_sum * float(i % 97) + float(size * step);
    EXPECT_EQ(wrong, 0) << "step " << step;
  }
}

void check_reduction(GradientReducer::Progress progress) {
  std::vector<float> grads(std::size_t(kTensors.back().first + kTensors.back().second), 0.0f);
  GradientReducer reducer(MPI_COMM_WORLD, grads.data(), ddp::plan_buckets(kTensors, 0.002, 0.0005), progress);
  check_reduction(reducer, grads.data());
}

TEST(GradientReducer, PollingGivesTheSum) { check_reduction(GradientReducer::Progress::Poll); }
TEST(GradientReducer, ThreadGivesTheSum) { check_reduction(GradientReducer::Progress::Thread); }

std::unique_ptr<ddp::ShmReducer> make_shm(std::vector<float>& grads, const Tensors& t, double mb,
                                          double first_mb) {
  auto reducer = ddp::ShmReducer::make(MPI_COMM_WORLD, grads.data(), ddp::plan_buckets(t, mb, first_mb));
  // Every rank of a test runs on this one machine.
  EXPECT_NE(reducer, nullptr);
  return reducer;
}

// Each bucket copied into the window as backward makes it.
TEST(ShmReducer, GivesTheSum) {
  std::vector<float> grads(std::size_t(kTensors.back().first + kTensors.back().second), 0.0f);
  auto reducer = make_shm(grads, kTensors, 0.002, 0.0005);
  ASSERT_NE(reducer, nullptr);
  check_reduction(*reducer, grads.data());
}

// The gradients live in the window (the trainer's way): the values move with them.
TEST(ShmReducer, GivesTheSumInItsOwnBuffer) {
  std::vector<float> grads(std::size_t(kTensors.back().first + kTensors.back().second));
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(i % 13);
  auto reducer = make_shm(grads, kTensors, 0.002, 0.0005);
  ASSERT_NE(reducer, nullptr);
  float* own = reducer->take_gradients();
  ASSERT_NE(own, nullptr);
  EXPECT_NE(own, grads.data());
  EXPECT_EQ(std::memcmp(own, grads.data(), grads.size() * sizeof(float)), 0);
  EXPECT_EQ(reducer->take_gradients(), own);
  check_reduction(*reducer, own);
}

// Sums that round: every rank must end with the same bits (data parallelism keeps
// the replicas equal only so), and with the sum in rank order.
TEST(ShmReducer, EveryRankHoldsTheSameBits) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Tensors t = layout({4099, 17, 70001, 3});
  std::vector<float> grads(70001 + 4099 + 17 + 3);
  auto reducer = make_shm(grads, t, 0.05, 0.001);
  ASSERT_NE(reducer, nullptr);
  float* own = reducer->take_gradients();
  std::vector<std::vector<float>> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::mt19937 gen(std::uint32_t(1000 + r));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    all[std::size_t(r)].resize(grads.size());
    for (float& x : all[std::size_t(r)]) x = u(gen) * std::pow(10.0f, u(gen) * 3.0f);
  }
  std::memcpy(own, all[std::size_t(rank)].data(), grads.size() * sizeof(float));
  reducer->mark_ready(0);
  reducer->finish();
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    float s = all[0][i];
    for (int r = 1; r < size; ++r) s += all[std::size_t(r)][i];
    wrong += std::memcmp(&s, own + i, sizeof(float)) != 0;
  }
  EXPECT_EQ(wrong, 0) << "sums that are not rank 0's + rank 1's + ... in float";
  EXPECT_EQ(reducer->nonfinite_sums(), 0);
}

// inf and NaN of any rank, in any rank's share, counted once on every rank: the
// trainer's non-finite check reads this count instead of passing over the sums.
TEST(ShmReducer, CountsTheSumsThatAreNotFinite) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Tensors t = layout({50000, 10});
  std::vector<float> grads(50010, 1.0f);
  auto reducer = make_shm(grads, t, 1.0, 0.5);
  ASSERT_NE(reducer, nullptr);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int step = 0; step < 2; ++step) {
    std::fill(grads.begin(), grads.end(), 1.0f);
    std::int64_t expect = 0;
    if (step == 0) {
      // The last rank: an inf at the start, a NaN at the end, an inf in the middle.
      if (rank == size - 1) grads[0] = inf, grads[50009] = nan, grads[25003] = -inf;
      expect = 3;
      // +inf on rank 0 and -inf on the last rank make a NaN where they meet.
      if (size > 1) {
        if (rank == 0) grads[40000] = inf;
        if (rank == size - 1) grads[40000] = -inf;
        ++expect;
      }
    }
    reducer->mark_ready(0);
    reducer->finish();
    EXPECT_EQ(reducer->nonfinite_sums(), expect) << "step " << step;
    if (step == 0) {
      EXPECT_TRUE(std::isinf(grads[0]));
      EXPECT_TRUE(std::isnan(grads[50009]));
    } else {
      EXPECT_EQ(grads[0], float(size));  // the count is the last finish()'s, not a running one
    }
  }
}

// Only what backward has finished is copied at mark_ready: the rest at finish().
TEST(ShmReducer, BucketsAreCopiedOnlyWhenTheirGradientsAreFinal) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Tensors t = layout({1000, 1000});
  std::vector<float> grads(2000, 1.0f);
  auto reducer = make_shm(grads, t, 1000 / kFloatsPerMb, 1000 / kFloatsPerMb);
  ASSERT_NE(reducer, nullptr);
  ASSERT_EQ(reducer->buckets().size(), 2u);
  reducer->mark_ready(1000);
  grads[1999] = 5.0f;  // already copied: this write is the caller's error, and is not seen
  for (std::size_t i = 0; i < 1000; ++i) grads[i] = 2.0f;  // first tensor final only now
  reducer->finish();
  EXPECT_EQ(grads[0], 2.0f * float(size));
  EXPECT_EQ(grads[1999], 1.0f * float(size));
}

TEST(GradientReducer, BucketsStartOnlyWhenTheirGradientsAreFinal) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) GTEST_SKIP() << "needs 2 or more ranks";
  // Two buckets; only the last tensor is final before finish(): a bucket started
  // early would have reduced stale values of the first tensor.
  const Tensors t = layout({1000, 1000});
  std::vector<float> grads(2000, 1.0f);
  GradientReducer reducer(MPI_COMM_WORLD, grads.data(),
                          ddp::plan_buckets(t, 1000 / kFloatsPerMb, 1000 / kFloatsPerMb),
                          GradientReducer::Progress::Poll);
  ASSERT_EQ(reducer.buckets().size(), 2u);
  reducer.mark_ready(1000);
  for (std::size_t i = 0; i < 1000; ++i) grads[i] = 2.0f;  // first tensor final only now
  reducer.finish();
  EXPECT_EQ(grads[0], 2.0f * float(size));
  EXPECT_EQ(grads[1999], 1.0f * float(size));
}

}  // namespace
