// metrics.jsonl at start-up (io/metrics.hpp): the records of steps after the one a
// run starts from, and a last line cut short by a kill, move to
// metrics_replaced.jsonl; the rest stays, and the run's records follow it. The same
// through real runs, with TensorBoard's files: e2e_tensorboard_np2.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/metrics.hpp"

namespace {

struct MetricsDir : ::testing::Test {
  std::string dir;
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_metrics_XXXXXX";
    dir = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string read(const std::string& name) const {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
  }
  bool exists(const std::string& name) const { return std::filesystem::exists(dir + "/" + name); }
};

const std::string kEpoch1 = "{\"epoch\": 1, \"step\": 5, \"train_loss\": 1.5}\n";
const std::string kEpoch2 = "{\"epoch\": 2, \"step\": 10, \"train_loss\": 1.25}\n";
const std::string kEpoch3 = "{\"epoch\": 3, \"step\": 15, \"train_loss\": 1}\n";
const std::string kOther = "{\"note\": \"a line of the user's, without a step\"}\n";
const std::string kCut = "{\"epoch\": 4, \"st";  // the write a kill cut short

TEST_F(MetricsDir, RecordsAfterTheStartStepMoveAside) {
  write("metrics.jsonl", kEpoch1 + kEpoch2 + kOther + kEpoch3 + kCut);
  {
    ddp::MetricsWriter metrics(dir, true, 10);
    metrics.write({{"epoch", 3LL}, {"step", 15LL}});
  }
  EXPECT_EQ(read("metrics.jsonl"), kEpoch1 + kEpoch2 + kOther + "{\"epoch\": 3, \"step\": 15}\n");
  EXPECT_EQ(read("metrics_replaced.jsonl"), kEpoch3 + kCut + "\n");
  // Another start from step 10 sets aside the new record of step 15 too, after the first.
  { const ddp::MetricsWriter again(dir, true, 10); }
  EXPECT_EQ(read("metrics_replaced.jsonl"), kEpoch3 + kCut + "\n" + "{\"epoch\": 3, \"step\": 15}\n");
  EXPECT_EQ(read("metrics.jsonl"), kEpoch1 + kEpoch2 + kOther);
}

TEST_F(MetricsDir, ANewRunSetsAsideEveryRecord) {
  write("metrics.jsonl", kEpoch1 + kEpoch2);
  { const ddp::MetricsWriter metrics(dir, true, 0); }
  EXPECT_EQ(read("metrics.jsonl"), "");
  EXPECT_EQ(read("metrics_replaced.jsonl"), kEpoch1 + kEpoch2);
}

TEST_F(MetricsDir, NothingLaterLeavesTheFileAsItWas) {
  write("metrics.jsonl", kEpoch1 + kEpoch2);
  struct stat before {};
  ASSERT_EQ(stat((dir + "/metrics.jsonl").c_str(), &before), 0);
  { const ddp::MetricsWriter metrics(dir, true, 10); }
  struct stat after {};
  ASSERT_EQ(stat((dir + "/metrics.jsonl").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "rewritten with nothing to set aside";
  EXPECT_EQ(read("metrics.jsonl"), kEpoch1 + kEpoch2);
  EXPECT_FALSE(exists("metrics_replaced.jsonl"));
}

TEST_F(MetricsDir, OnlyTheWritingRankLooks) {
  write("metrics.jsonl", kEpoch1 + kEpoch2);
  { const ddp::MetricsWriter metrics(dir, false, 0); }
  EXPECT_EQ(read("metrics.jsonl"), kEpoch1 + kEpoch2);
  EXPECT_FALSE(exists("metrics_replaced.jsonl"));
}

}  // namespace
