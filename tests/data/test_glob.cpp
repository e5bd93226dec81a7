// expand_globs: sorted per pattern, concatenated, duplicates dropped, and a
// pattern matching nothing is the user's error.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "comm/check.hpp"
#include "io/glob.hpp"

namespace {

class GlobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/ddp_glob_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
    for (const char* f : {"b_002.h5", "b_000.h5", "b_010.h5", "a_001.h5", "odd[1].h5"})
      std::ofstream(dir_ + "/" + f) << "x";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(GlobTest, SortedConcatenatedDeduplicated) {
  const auto files =
      ddp::expand_globs({dir_ + "/b_*.h5", dir_ + "/a_*.h5", dir_ + "/b_000.h5"}, "data.train_files");
  const std::vector<std::string> expected = {dir_ + "/b_000.h5", dir_ + "/b_002.h5", dir_ + "/b_010.h5",
                                             dir_ + "/a_001.h5"};
  EXPECT_EQ(files, expected);
}

TEST_F(GlobTest, LiteralNameWithGlobCharacters) {
  EXPECT_EQ(ddp::expand_globs({dir_ + "/odd[1].h5"}, "data.val_files"),
            std::vector<std::string>{dir_ + "/odd[1].h5"});
}

TEST_F(GlobTest, NoMatchIsAnInputError) {
  try {
    ddp::expand_globs({dir_ + "/a_*.h5", dir_ + "/train_*.h5"}, "data.train_files");
    FAIL() << "no error for a pattern matching nothing";
  } catch (const ddp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "data.train_files: '" + dir_ + "/train_*.h5' matches no file");
  }
}

}  // namespace
