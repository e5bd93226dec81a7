// Bucketed, overlapped gradient all-reduce: bucket planning and the sums it
// produces, for both ways of making MPI progress.
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>

#include "comm/gradient_reducer.hpp"

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

// Each rank holds grads[i] = (rank + 1) * (i % 97): the sums are exact in float.
void check_reduction(GradientReducer::Progress progress) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Tensors t = layout({3000, 300, 30000, 700, 5, 12000, 40});
  const std::int64_t n = t.back().first + t.back().second;
  std::vector<float> grads(std::size_t(n), 0.0f);
  GradientReducer reducer(MPI_COMM_WORLD, grads.data(), ddp::plan_buckets(t, 0.002, 0.0005), progress);
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

TEST(GradientReducer, PollingGivesTheSum) { check_reduction(GradientReducer::Progress::Poll); }
TEST(GradientReducer, ThreadGivesTheSum) { check_reduction(GradientReducer::Progress::Thread); }

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
