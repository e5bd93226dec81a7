// ShardDataset on 1..4 ranks: metadata, and read() of random index sets (repeats,
// any order, across shard borders) checked value by value against what the
// shards were written with, streaming and preloaded.
#include <gtest/gtest.h>

#include <random>

#include "comm/check.hpp"
#include "io/shard_dataset.hpp"
#include "shard_files.hpp"

using namespace ddp;
using namespace ddp::test;

namespace {

class ShardDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_shared_tmpdir(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      // uint8 images (1, 4, 3) with labels; shard sizes 5, 0, 7, 4 (an empty one too).
      std::int64_t first = 0;
      const std::int64_t counts[] = {5, 0, 7, 4};
      for (int i = 0; i < 4; ++i) {
        ShardSpec s;
        s.first = first;
        s.count = counts[i];
        s.sample_shape = {1, 4, 3};
        s.classes = 6;
        write_shard(dir_ + "/u8_00" + std::to_string(i) + ".h5", s);
        first += counts[i];
      }
      // float32 (2, 3) with float targets (2); shards of 6 and 9.
      for (int i = 0; i < 2; ++i) {
        ShardSpec s;
        s.first = i * 6;
        s.count = i == 0 ? 6 : 9;
        s.sample_shape = {2, 3};
        s.x_uint8 = false;
        s.labels = false;
        s.target_shape = {2};
        write_shard(dir_ + "/f32_00" + std::to_string(i) + ".h5", s);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  static void TearDownTestSuite() { remove_shared_tmpdir(MPI_COMM_WORLD, dir_); }

  static int rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  // A rank-dependent random index set with repeats; its length differs per rank,
  // so reads are truly independent.
  static std::vector<std::int64_t> random_indices(std::int64_t n, std::uint64_t salt) {
    std::mt19937_64 gen(1234 + 17 * rank() + salt);
    std::vector<std::int64_t> idx(std::size_t(5 + 3 * rank() + salt % 5));
    for (auto& i : idx) i = std::int64_t(gen() % std::uint64_t(n));
    idx.push_back(idx.front());  // a sure repeat
    idx.push_back(n - 1);
    idx.push_back(0);
    return idx;
  }

  static void check_u8(ShardDataset& ds) {
    for (std::uint64_t trial = 0; trial < 5; ++trial) {
      const auto idx = random_indices(ds.size(), trial);
      const auto n = std::int64_t(idx.size());
      std::vector<float> x(std::size_t(n * ds.sample_numel()), -1.f);
      std::vector<std::int32_t> y(std::size_t(n), -1);
      ds.read(idx.data(), n, x.data(), y.data(), nullptr);
      for (std::int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(y[i], idx[i] % 6) << "sample " << idx[i];
        for (std::int64_t k = 0; k < ds.sample_numel(); ++k)
          ASSERT_EQ(x[i * ds.sample_numel() + k], x_u8(idx[i], k) / 255.0f)
              << "sample " << idx[i] << " element " << k;
      }
    }
  }

  static void check_f32(ShardDataset& ds) {
    for (std::uint64_t trial = 0; trial < 5; ++trial) {
      const auto idx = random_indices(ds.size(), trial);
      const auto n = std::int64_t(idx.size());
      std::vector<float> x(std::size_t(n * 6), -1.f), t(std::size_t(n * 2), 1.f);
      ds.read(idx.data(), n, x.data(), nullptr, t.data());
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t k = 0; k < 6; ++k) ASSERT_EQ(x[i * 6 + k], x_f32(idx[i], k));
        for (std::int64_t j = 0; j < 2; ++j) ASSERT_EQ(t[i * 2 + j], target_value(idx[i], j));
      }
    }
  }

  static std::string dir_;
};
std::string ShardDatasetTest::dir_;

TEST_F(ShardDatasetTest, Metadata) {
  ShardDataset u8(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  EXPECT_EQ(u8.size(), 16);
  EXPECT_EQ(u8.sample_shape(), (std::vector<std::int64_t>{1, 4, 3}));
  EXPECT_EQ(u8.sample_numel(), 12);
  EXPECT_TRUE(u8.has_class_labels());
  EXPECT_TRUE(u8.x_is_uint8());
  EXPECT_EQ(u8.target_numel(), 1);
  EXPECT_EQ(u8.bytes(), 16u * 12u + 16u * 8u);  // uint8 x, int64 y
  ASSERT_EQ(u8.files().size(), 4u);
  EXPECT_EQ(u8.files()[0], dir_ + "/u8_000.h5");
  EXPECT_EQ(u8.files()[3], dir_ + "/u8_003.h5");
  EXPECT_FALSE(u8.preloaded());

  ShardDataset f32(MPI_COMM_WORLD, {dir_ + "/f32_001.h5", dir_ + "/f32_*.h5"}, "data.val_files");
  EXPECT_EQ(f32.size(), 15);
  ASSERT_EQ(f32.files().size(), 2u);
  EXPECT_EQ(f32.files()[0], dir_ + "/f32_001.h5") << "pattern order, then duplicates dropped";
  EXPECT_FALSE(f32.has_class_labels());
  EXPECT_EQ(f32.target_shape(), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(f32.target_numel(), 2);
  EXPECT_EQ(f32.bytes(), 15u * 6u * 4u + 15u * 2u * 4u);
}

TEST_F(ShardDatasetTest, ReadUint8LabelsStreaming) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  check_u8(ds);
}

TEST_F(ShardDatasetTest, ReadUint8LabelsPreloaded) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  ds.preload();
  EXPECT_TRUE(ds.preloaded());
  check_u8(ds);
}

TEST_F(ShardDatasetTest, ReadFloatTargetsStreamingAndPreloaded) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/f32_*.h5"}, "data.train_files");
  check_f32(ds);
  ds.preload();
  check_f32(ds);
}

TEST_F(ShardDatasetTest, EmptyReadAndOutOfRange) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  ds.read(nullptr, 0, nullptr, nullptr, nullptr);  // no-op, no HDF5 call with an empty selection
  const std::int64_t bad[] = {3, 16};
  std::vector<float> x(24);
  EXPECT_THROW(ds.read(bad, 2, x.data(), nullptr, nullptr), std::out_of_range);
  const std::int64_t neg[] = {-1};
  EXPECT_THROW(ds.read(neg, 1, x.data(), nullptr, nullptr), std::out_of_range);
}

TEST_F(ShardDatasetTest, CheckLabelsInRange) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  EXPECT_NO_THROW(ds.check_labels(6));
  ShardDataset f(MPI_COMM_WORLD, {dir_ + "/f32_*.h5"}, "data.val_files");
  try {
    f.check_labels(10);
    ADD_FAILURE() << "float targets accepted as labels";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "data.val_files: /y holds float32 targets, not integer class labels");
  }
}

}  // namespace
