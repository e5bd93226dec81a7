// BatchLoader: synchronous and prefetching loaders give identical batches;
// stopping mid-epoch does not hang; a read error reaches the caller.
#include <gtest/gtest.h>

#include <algorithm>

#include "io/batch_loader.hpp"
#include "io/sampler.hpp"
#include "shard_files.hpp"

using namespace ddp;
using namespace ddp::test;

namespace {

class BatchLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_shared_tmpdir(MPI_COMM_WORLD);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (rank_ == 0) {
      for (int i = 0; i < 3; ++i) {  // 100 samples: 3 ranks get uneven shares
        ShardSpec s;
        s.first = 33 * i;
        s.count = i == 2 ? 34 : 33;  // 100 samples
        s.sample_shape = {1, 5, 5};
        write_shard(dir_ + "/train_00" + std::to_string(i) + ".h5", s);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  static void TearDownTestSuite() { remove_shared_tmpdir(MPI_COMM_WORLD, dir_); }

  static std::vector<Batch> drain(BatchLoader& loader) {
    std::vector<Batch> out;
    Batch b;
    while (loader.next(b)) out.push_back(b);
    return out;
  }

  static std::string dir_;
  static int rank_, size_;
};
std::string BatchLoaderTest::dir_;
int BatchLoaderTest::rank_ = 0;
int BatchLoaderTest::size_ = 1;

TEST_F(BatchLoaderTest, PrefetchMatchesSynchronous) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  ASSERT_EQ(ds.size(), 100);
  DistributedSampler sampler(ds.size(), size_, rank_, true, 5, false);
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.set_epoch(epoch);
    const auto idx = sampler.indices();
    BatchLoader sync(ds, idx, 8, 0), ahead(ds, idx, 8, 3);
    const std::int64_t expected_batches = (sampler.num_samples() + 7) / 8;
    EXPECT_EQ(sync.num_batches(), expected_batches);
    EXPECT_EQ(ahead.num_batches(), expected_batches);
    const auto a = drain(sync), b = drain(ahead);
    ASSERT_EQ(std::int64_t(a.size()), expected_batches);
    ASSERT_EQ(a.size(), b.size());
    std::int64_t seen = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].size, std::min<std::int64_t>(8, sampler.num_samples() - seen));
      EXPECT_EQ(a[i].size, b[i].size);
      EXPECT_EQ(a[i].index, b[i].index);
      EXPECT_EQ(a[i].x, b[i].x);
      EXPECT_EQ(a[i].labels, b[i].labels);
      EXPECT_TRUE(a[i].targets.empty());
      for (std::int64_t j = 0; j < a[i].size; ++j) {
        EXPECT_EQ(a[i].index[j], idx[seen + j]);
        EXPECT_EQ(a[i].labels[j], idx[seen + j] % 10);
        EXPECT_EQ(a[i].x[j * 25 + 7], x_u8(idx[seen + j], 7) / 255.0f);
      }
      seen += a[i].size;
    }
    EXPECT_EQ(seen, sampler.num_samples());
    Batch extra;
    EXPECT_FALSE(ahead.next(extra)) << "stays exhausted";
    EXPECT_GE(ahead.wait_seconds(), 0.0);
  }
}

// Batches read into a past epoch's buffers (the trainer's reuse across epochs) are
// the batches a fresh loader reads, also after a short last batch; an epoch's first
// batch is read into a buffer of the last epoch's, and the buffers do not pile up.
TEST_F(BatchLoaderTest, ReusedBuffersGiveTheSameBatches) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  DistributedSampler sampler(ds.size(), size_, rank_, true, 5, false);
  ASSERT_NE(sampler.num_samples() % 8, 0) << "the test wants a short last batch";
  ASSERT_GE(sampler.num_samples(), 16) << "and two batches at least";
  for (int depth : {0, 3}) {
    std::vector<Batch> pool;
    for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);
      const auto idx = sampler.indices();
      BatchLoader fresh(ds, idx, 8, 0);
      const auto expected = drain(fresh);
      std::vector<const void*> buffers;  // the last epoch's x buffers
      for (const Batch& b : pool) buffers.push_back(b.x.data());
      // as the trainer does: a batch in hand from the pool, the rest to the loader
      Batch batch;
      if (!pool.empty()) {
        batch = std::move(pool.back());
        pool.pop_back();
      }
      std::vector<Batch> got;
      {
        BatchLoader reusing(ds, idx, 8, depth, false, &pool);
        EXPECT_TRUE(pool.empty()) << "the loader holds the buffers while it lives";
        while (reusing.next(batch)) {
          if (got.empty() && epoch > 0) {
            EXPECT_NE(std::find(buffers.begin(), buffers.end(), batch.x.data()), buffers.end())
                << "depth " << depth << ", epoch " << epoch << ": the first batch in a new buffer";
          }
          got.push_back(batch);
        }
      }
      pool.push_back(std::move(batch));
      EXPECT_LE(pool.size(), std::size_t(depth + 2)) << "depth " << depth << ", epoch " << epoch;
      for (const Batch& b : pool) EXPECT_NE(b.x.data(), nullptr) << "an empty batch kept";
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].size, expected[i].size);
        EXPECT_EQ(got[i].index, expected[i].index);
        EXPECT_EQ(got[i].x, expected[i].x);
        EXPECT_EQ(got[i].labels, expected[i].labels);
      }
    }
  }
}

TEST_F(BatchLoaderTest, PreloadedWithPrefetch) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  const auto idx = shard_indices(ds.size(), size_, rank_);
  BatchLoader streamed(ds, idx, 7, 2);
  const auto a = drain(streamed);
  ds.preload();
  BatchLoader loaded(ds, idx, 7, 2);
  const auto b = drain(loaded);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].x, b[i].x);
    EXPECT_EQ(a[i].labels, b[i].labels);
  }
}

TEST_F(BatchLoaderTest, DestructorMidEpochDoesNotHang) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  std::vector<std::int64_t> idx(2000);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = std::int64_t(i * 37 % 100);
  for (int depth : {1, 3}) {
    { BatchLoader untouched(ds, idx, 4, depth); }
    {
      BatchLoader loader(ds, idx, 4, depth);
      Batch b;
      ASSERT_TRUE(loader.next(b));
      ASSERT_TRUE(loader.next(b));
      EXPECT_EQ(b.index[0], idx[4]);
    }  // the thread is blocked on a full queue here, or mid-read
  }
}

TEST_F(BatchLoaderTest, ReadErrorReachesCaller) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  const std::vector<std::int64_t> idx = {0, 1, 2, 3, 4, 100};  // 100 is past the end
  for (int depth : {0, 2}) {
    BatchLoader loader(ds, idx, 3, depth);
    Batch b;
    ASSERT_TRUE(loader.next(b)) << "depth " << depth;
    EXPECT_THROW(loader.next(b), std::out_of_range) << "depth " << depth;
  }
}

TEST_F(BatchLoaderTest, EmptyIndexList) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/train_*.h5"}, "data.train_files");
  BatchLoader loader(ds, {}, 4, 2);
  EXPECT_EQ(loader.num_batches(), 0);
  Batch b;
  EXPECT_FALSE(loader.next(b));
}

}  // namespace
