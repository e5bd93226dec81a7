// Every user error in the shard files becomes the same one-line InputError on
// every rank, naming the file and the problem (a rank that did not throw would
// leave the others in a collective: the test's timeout would catch that).
#include <gtest/gtest.h>

#include <fstream>

#include "comm/check.hpp"
#include "io/shard_dataset.hpp"
#include "shard_files.hpp"

using namespace ddp;
using namespace ddp::test;

namespace {

class ShardErrorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_shared_tmpdir(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      ShardSpec good;
      good.count = 4;
      good.sample_shape = {1, 4, 4};
      write_shard(dir_ + "/good_000.h5", good);

      std::ofstream(dir_ + "/text.h5") << "not hdf5 at all\n";

      ShardSpec no_x = good;
      no_x.write_x = false;
      write_shard(dir_ + "/nox_000.h5", no_x);

      ShardSpec narrow = good;
      narrow.sample_shape = {1, 4, 3};
      write_shard(dir_ + "/shape_000.h5", good);
      write_shard(dir_ + "/shape_001.h5", narrow);

      ShardSpec short_y = good;
      short_y.y_count = 3;
      write_shard(dir_ + "/shorty_000.h5", short_y);

      ShardSpec int16 = good;
      int16.x_type = H5T_STD_I16LE;
      write_shard(dir_ + "/int16_000.h5", int16);

      ShardSpec floats = good;
      floats.x_uint8 = false;
      write_shard(dir_ + "/mixed_000.h5", good);
      write_shard(dir_ + "/mixed_001.h5", floats);

      ShardSpec targets = good;
      targets.labels = false;
      write_shard(dir_ + "/kind_000.h5", good);
      write_shard(dir_ + "/kind_001.h5", targets);

      ShardSpec many = good;  // labels g % 10 with 12 samples: max label 9
      many.count = 12;
      write_shard(dir_ + "/labels_000.h5", good);  // labels 0..3
      many.first = 4;                              // labels 4..9, 0..5
      write_shard(dir_ + "/labels_001.h5", many);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  static void TearDownTestSuite() { remove_shared_tmpdir(MPI_COMM_WORLD, dir_); }

  // The message the constructor throws, or "" when it does not.
  static std::string open_error(const std::vector<std::string>& patterns) {
    try {
      ShardDataset ds(MPI_COMM_WORLD, patterns, "data.train_files");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }

  static std::string dir_;
};
std::string ShardErrorTest::dir_;

TEST_F(ShardErrorTest, MissingFile) {
  EXPECT_EQ(open_error({dir_ + "/good_000.h5", dir_ + "/missing.h5"}),
            "data.train_files: '" + dir_ + "/missing.h5' matches no file");
}

TEST_F(ShardErrorTest, EmptyGlob) {
  EXPECT_EQ(open_error({dir_ + "/nothing_*.h5"}),
            "data.train_files: '" + dir_ + "/nothing_*.h5' matches no file");
}

TEST_F(ShardErrorTest, NoPatterns) { EXPECT_EQ(open_error({}), "data.train_files: no file pattern given"); }

TEST_F(ShardErrorTest, NotHdf5) {
  EXPECT_EQ(open_error({dir_ + "/text.h5"}), dir_ + "/text.h5: not an HDF5 file");
}

TEST_F(ShardErrorTest, Directory) {
  EXPECT_EQ(open_error({dir_}), dir_ + ": is a directory, not a shard file");
}

TEST_F(ShardErrorTest, MissingX) {
  EXPECT_EQ(open_error({dir_ + "/nox_*.h5"}), dir_ + "/nox_000.h5: has no dataset /x");
}

// uint8 (N, C, H, W) are images: the message says which extents must agree.
TEST_F(ShardErrorTest, SampleShapesDisagree) {
  EXPECT_EQ(open_error({dir_ + "/shape_*.h5"}),
            dir_ + "/shape_001.h5: /x holds images of (C,H,W) = (1,4,3) but " + dir_ +
                "/shape_000.h5 holds (1,4,4); every shard needs the same "
                "side and channels");
}

TEST_F(ShardErrorTest, YCountDiffers) {
  EXPECT_EQ(open_error({dir_ + "/shorty_000.h5"}), dir_ + "/shorty_000.h5: /y has 3 samples but /x has 4");
}

TEST_F(ShardErrorTest, WrongXType) {
  EXPECT_EQ(open_error({dir_ + "/int16_000.h5"}),
            dir_ + "/int16_000.h5: /x is int16; expected float32 or uint8");
}

TEST_F(ShardErrorTest, XTypesDisagree) {
  EXPECT_EQ(open_error({dir_ + "/mixed_*.h5"}),
            dir_ + "/mixed_001.h5: /x is float32 but " + dir_ + "/mixed_000.h5 has uint8");
}

TEST_F(ShardErrorTest, YKindsDisagree) {
  EXPECT_EQ(open_error({dir_ + "/kind_*.h5"}), dir_ + "/kind_001.h5: /y holds float32 targets but " + dir_ +
                                                   "/kind_000.h5 holds integer labels");
}

TEST_F(ShardErrorTest, LabelOutOfRange) {
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/labels_*.h5"}, "data.train_files");
  EXPECT_NO_THROW(ds.check_labels(10));
  try {
    ds.check_labels(8);
    ADD_FAILURE() << "label 8 accepted with 8 classes";
  } catch (const InputError& e) {
    // labels_001 holds 4..9, 0..5: its first label >= 8 is /y[4] = 8.
    EXPECT_EQ(std::string(e.what()), dir_ +
                                         "/labels_001.h5: label /y[4] = 8 is outside [0, 8) "
                                         "for a model with 8 classes");
  }
}

TEST_F(ShardErrorTest, UsableAfterErrors) {
  // Errors leave nothing behind (no leaked communicator, HDF5 still quiet and working).
  ShardDataset ds(MPI_COMM_WORLD, {dir_ + "/good_000.h5"}, "data.train_files");
  EXPECT_EQ(ds.size(), 4);
}

}  // namespace
