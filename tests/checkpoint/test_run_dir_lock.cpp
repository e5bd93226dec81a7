// One run at a time in a run directory (io/run_dir_lock.hpp), on one process: an
// open file description's lock conflicts with another one of the same process, so
// two RunDirLocks here stand for two runs. The lock of a process that dies, killed
// or not, is e2e_run_dir_in_use_np2's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/run_dir_lock.hpp"

namespace {

using ddp::RunDirLock;

struct RunDir : ::testing::Test {
  std::string dir;
  void SetUp() override {
    char tmpl[] = "/tmp/ddp_lock_XXXXXX";
    dir = mkdtemp(tmpl);
    for (const char* v : {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"})
      unsetenv(v);  // not under Slurm
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string file_text() const {
    std::ifstream in(RunDirLock::file_of(dir));
    std::string line;
    std::getline(in, line);
    return line;
  }
};

std::string host_name() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return host;
}

TEST_F(RunDir, SecondRunIsToldWhoHoldsIt) {
  EXPECT_EQ(RunDirLock::holder(dir), "") << "no lock file yet";
  const RunDirLock first(dir, "inputs/a.nml");
  ASSERT_TRUE(first.held()) << first.problem() << first.warning();
  EXPECT_EQ(first.problem(), "");
  EXPECT_EQ(first.warning(), "");
  const std::string holder = "pid " + std::to_string(getpid()) + " on " + host_name();
  EXPECT_EQ(file_text().rfind(holder + ", since ", 0), 0u) << file_text();
  EXPECT_NE(file_text().find(" UTC, input inputs/a.nml"), std::string::npos) << file_text();

  const RunDirLock second(dir, "inputs/b.nml");
  EXPECT_FALSE(second.held());
  EXPECT_EQ(second.warning(), "");
  EXPECT_EQ(second.problem(),
            "io.run_dir '" + dir + "' is in use by another run of ddp_train (" + file_text() +
                "; it holds the lock on " + dir +
                "/ddp_train.lock): two runs in one directory would write over each other's "
                "checkpoints and metrics; give this run an io.run_dir of its own, or start it "
                "when that run has ended");
  EXPECT_EQ(file_text().rfind(holder, 0), 0u)
      << "the second run wrote over the holder's line: " << file_text();
  EXPECT_EQ(RunDirLock::holder(dir), file_text()) << "asked without taking it (ddp_train --check)";
}

TEST_F(RunDir, FreeOnceTheHolderLetsGo) {
  {
    RunDirLock first(dir, "inputs/a.nml");
    ASSERT_TRUE(first.held());
    const RunDirLock moved = std::move(first);  // the lock goes with it
    EXPECT_TRUE(moved.held());
    EXPECT_FALSE(first.held());
    EXPECT_FALSE(RunDirLock(dir, "inputs/b.nml").held());
  }
  EXPECT_EQ(RunDirLock::holder(dir), "") << "the file is left, the lock is not";
  const RunDirLock next(dir, "inputs/c.nml");
  EXPECT_TRUE(next.held()) << next.problem();
  EXPECT_NE(file_text().find("input inputs/c.nml"), std::string::npos) << file_text();
}

TEST_F(RunDir, NamesTheSlurmJob) {
  setenv("SLURM_JOB_ID", "4242", 1);
  {
    const RunDirLock job(dir, "a.nml");
    EXPECT_NE(file_text().find(", Slurm job 4242, since "), std::string::npos) << file_text();
  }
  setenv("SLURM_ARRAY_JOB_ID", "4240", 1);
  setenv("SLURM_ARRAY_TASK_ID", "2", 1);
  {
    const RunDirLock task(dir, "a.nml");
    EXPECT_NE(file_text().find(", Slurm job 4240_2, since "), std::string::npos) << file_text();
    const RunDirLock second(dir, "a.nml");
    EXPECT_NE(second.problem().find(", Slurm job 4240_2, since "), std::string::npos) << second.problem();
  }
}

TEST_F(RunDir, NoDirectoryIsAProblem) {
  const RunDirLock lock(dir + "/missing", "a.nml");
  EXPECT_FALSE(lock.held());
  EXPECT_EQ(lock.problem(),
            "io.run_dir: cannot open " + dir +
                "/missing/ddp_train.lock (the lock that keeps a second run out): No such file or "
                "directory");
}

}  // namespace
