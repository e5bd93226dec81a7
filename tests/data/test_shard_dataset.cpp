// ShardDataset on 1..4 ranks: metadata, and read() of random index sets (repeats,
// any order, across shard borders) checked value by value against what the
// shards were written with, streaming and preloaded.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
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

TEST_F(ShardDatasetTest, PreloadedOnceForTheNode) {
  // Both sets in one segment of the node's shared memory, the second at the first's
  // end: each rank reads what its node's first rank alone put there.
  ShardDataset u8(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  ShardDataset f32(MPI_COMM_WORLD, {dir_ + "/f32_*.h5"}, "data.val_files");
  EXPECT_EQ(u8.preload_bytes(), 256u) << "x 16 x 12 B, labels 16 x 4 B, each part in whole 64 B lines";
  EXPECT_EQ(f32.preload_bytes(), 384u + 128u) << "x 15 x 24 B, targets 15 x 8 B";
  std::string why;
  std::shared_ptr<NodeShared> node =
      NodeShared::make(MPI_COMM_WORLD, u8.preload_bytes() + f32.preload_bytes(), &why);
  ASSERT_TRUE(node) << why;
  // Its name is gone from /dev/shm once every rank of the node has it mapped.
  if (node->first()) {
    EXPECT_NE(
        std::system(("ls /dev/shm | grep -q '^ddp_train\\." + std::to_string(getpid()) + "\\.'").c_str()), 0)
        << "a name left in /dev/shm";
  }
  u8.preload(node, 0);
  f32.preload(node, u8.preload_bytes());
  EXPECT_TRUE(u8.preloaded());
  EXPECT_EQ(node->data()[5 * 12 + 7], x_u8(5, 7)) << "sample 5's byte 7, where the node's first rank put it";
  check_u8(u8);
  check_f32(f32);
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

// The fingerprint a checkpoint keeps: per file its count and a hash of 16 sampled
// rows, the same on every rank. Rows 0, 2, 5, ... 39 of a 40-row shard are sampled:
// a change there changes the hash, a change in row 1 does not (a sample, by design).
TEST_F(ShardDatasetTest, Fingerprint) {
  ShardDataset u8(MPI_COMM_WORLD, {dir_ + "/u8_*.h5"}, "data.train_files");
  const DataFingerprint& f = u8.fingerprint();
  EXPECT_EQ(f.files, u8.files());
  EXPECT_EQ(f.counts, (std::vector<std::int64_t>{5, 0, 7, 4}));
  EXPECT_EQ(f.samples(), 16);
  EXPECT_EQ(f.x_shape, (std::vector<std::int64_t>{1, 4, 3}));
  EXPECT_EQ(f.y_shape, std::vector<std::int64_t>{});
  ASSERT_EQ(f.hashes.size(), 4u);
  EXPECT_NE(f.hashes[0], f.hashes[2]);
  unsigned long long mine = f.hashes[2], lowest = 0;
  MPI_Allreduce(&mine, &lowest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(mine, lowest) << "every rank has rank 0's";

  const std::string d = dir_ + "/fp";
  if (rank() == 0) {
    ShardSpec s;
    s.count = 40;
    s.sample_shape = {1, 4, 3};
    mkdir(d.c_str(), 0755);
    for (const char* n : {"/a.h5", "/row1.h5", "/row2.h5"}) write_shard(d + n, s);
    // One value of row 1, then of row 2, set to 255 (written as x_u8(g, k) < 255 here).
    for (hsize_t row : {1, 2}) {
      const hid_t file =
          H5Fopen((d + "/row" + std::to_string(row) + ".h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      const hid_t x = H5Dopen2(file, "/x", H5P_DEFAULT), space = H5Dget_space(x);
      const hsize_t start[4] = {row, 0, 0, 0}, one[4] = {1, 1, 1, 1};
      H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, one, nullptr);
      const hid_t mem = H5Screate_simple(4, one, nullptr);
      const std::uint8_t v = 255;
      EXPECT_GE(H5Dwrite(x, H5T_NATIVE_UINT8, mem, space, H5P_DEFAULT, &v), 0);
      H5Sclose(mem);
      H5Sclose(space);
      H5Dclose(x);
      H5Fclose(file);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto hash = [&](const char* n) {
    return ShardDataset(MPI_COMM_WORLD, {d + n}, "data.train_files").fingerprint().hashes.at(0);
  };
  EXPECT_EQ(hash("/row1.h5"), hash("/a.h5"));
  EXPECT_NE(hash("/row2.h5"), hash("/a.h5"));
}

}  // namespace
