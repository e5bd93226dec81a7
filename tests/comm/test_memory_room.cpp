// The room a node's memory cgroup leaves (comm/memory_room.hpp), read from made-up
// cgroup v1 and v2 trees: the limit of the cgroup or of one above it, less what
// cannot be given back, and MemAvailable where that is tighter. The live v1 tree of a
// machine like ours, with a real limit and the kernel's killer: e2e_job_memory_limit_np2.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "comm/memory_room.hpp"

namespace {

using ddp::memory_room_from;
using ddp::MemoryRoom;

constexpr std::int64_t MiB = 1024 * 1024;

class MemoryRoomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/ddp_memory_room_XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    root_ = t;
  }
  void TearDown() override { (void)std::system(("rm -rf '" + root_ + "'").c_str()); }
  // Writes `text` to root_/path, making the directories.
  void put(const std::string& path, const std::string& text) {
    for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
      mkdir((root_ + path.substr(0, at)).c_str(), 0755);
    std::ofstream(root_ + path) << text;
  }
  std::string root_;
};

const std::string kMeminfo =
    "MemTotal:       65536000 kB\nMemFree:        1000 kB\nMemAvailable:   52428800 kB\n";
const std::string kMountsV1 =
    "25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs ro,mode=755\n"
    "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n"
    "32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
const std::string kMountsV2 =
    "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";

TEST_F(MemoryRoomTest, SlurmJobLimitOnCgroupV1) {
  // task/cgroup on v1: the limit on the job, none on the step or the task.
  const std::string job = "/sys/fs/cgroup/memory/slurm/uid_0/job_7";
  put(job + "/memory.limit_in_bytes", "1073741824\n");
  put(job + "/memory.stat", "cache 5\nrss 1\nshmem 1\ntotal_cache 900000000\ntotal_rss " +
                                std::to_string(100 * MiB) + "\ntotal_shmem " + std::to_string(50 * MiB) +
                                "\n");
  put(job + "/step_0/memory.limit_in_bytes", "9223372036854771712\n");
  put(job + "/step_0/task_0/memory.limit_in_bytes", "9223372036854771712\n");
  const MemoryRoom r = memory_room_from("4:memory:/slurm/uid_0/job_7/step_0/task_0\n3:cpu:/\n0::/\n",
                                        kMountsV1, kMeminfo, root_);
  EXPECT_EQ(r.limit, 1024 * MiB);
  EXPECT_EQ(r.free, 1024 * MiB - 150 * MiB) << "the page cache is not counted as taken";
  EXPECT_NE(r.what.find("cgroup /slurm/uid_0/job_7 (memory.limit_in_bytes 1024.0 MiB)"), std::string::npos)
      << r.what;
}

TEST_F(MemoryRoomTest, SlurmJobLimitOnCgroupV2) {
  const std::string job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_9";
  put(job + "/memory.max", "2147483648\n");
  put(job + "/memory.stat",
      "anon " + std::to_string(300 * MiB) + "\nfile 999999999\nshmem " + std::to_string(200 * MiB) + "\n");
  put(job + "/step_0/memory.max", "max\n");
  const MemoryRoom r = memory_room_from("0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n",
                                        kMountsV2, kMeminfo, root_);
  EXPECT_EQ(r.limit, 2048 * MiB);
  EXPECT_EQ(r.free, 2048 * MiB - 500 * MiB);
  EXPECT_NE(r.what.find("job_9 (memory.max 2048.0 MiB)"), std::string::npos) << r.what;
}

TEST_F(MemoryRoomTest, TheTightestLevelCounts) {
  // A child with the larger limit but a parent with less room left: the parent's.
  put("/sys/fs/cgroup/a/memory.max", std::to_string(1000 * MiB));
  put("/sys/fs/cgroup/a/memory.stat", "anon " + std::to_string(900 * MiB) + "\nshmem 0\n");
  put("/sys/fs/cgroup/a/b/memory.max", std::to_string(500 * MiB));
  put("/sys/fs/cgroup/a/b/memory.stat", "anon " + std::to_string(10 * MiB) + "\nshmem 0\n");
  const MemoryRoom r = memory_room_from("0::/a/b\n", kMountsV2, kMeminfo, root_);
  EXPECT_EQ(r.free, 100 * MiB);
  EXPECT_EQ(r.limit, 1000 * MiB);
  EXPECT_NE(r.what.find("cgroup /a ("), std::string::npos) << r.what;
}

TEST_F(MemoryRoomTest, AContainersMountOfItsSubtree) {
  // The mount's root is the container's cgroup: files are read relative to it.
  put("/sys/fs/cgroup/c1/memory.max", std::to_string(256 * MiB));
  put("/sys/fs/cgroup/c1/memory.stat", "anon 0\nshmem 0\n");
  const MemoryRoom r =
      memory_room_from("0::/kubepods/pod1/c1\n",
                       "40 30 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n", kMeminfo, root_);
  EXPECT_EQ(r.free, 256 * MiB);
  EXPECT_EQ(r.limit, 256 * MiB);
}

TEST_F(MemoryRoomTest, MemAvailableWhereTighterOrNoLimit) {
  put("/sys/fs/cgroup/a/memory.max", "max\n");
  const MemoryRoom none = memory_room_from("0::/a\n", kMountsV2, kMeminfo, root_);
  EXPECT_EQ(none.free, 50 * 1024 * MiB) << "MemAvailable, in kB";
  EXPECT_EQ(none.limit, 65536000LL * 1024);
  EXPECT_NE(none.what.find("MemAvailable"), std::string::npos) << none.what;

  put("/sys/fs/cgroup/a/memory.max", std::to_string(100 * 1024 * MiB));
  put("/sys/fs/cgroup/a/memory.stat", "anon 0\nshmem 0\n");
  EXPECT_NE(memory_room_from("0::/a\n", kMountsV2, kMeminfo, root_).what.find("MemAvailable"),
            std::string::npos)
      << "a cgroup limit above what the node has left";

  const MemoryRoom nothing = memory_room_from("", "", "", root_);
  EXPECT_EQ(nothing.free, -1) << "nothing known: no room claimed";

  // Files that do not hold counts (another kernel's, a broken mount) are not read as any.
  put("/sys/fs/cgroup/a/memory.max", "lots\n");
  EXPECT_EQ(memory_room_from("0::/a\n", kMountsV2, "MemAvailable: many kB\n", root_).free, -1);
}

TEST(MemoryRoom, ThisMachine) {
  // Whatever this machine has: some room, under a limit that is at least that room.
  const MemoryRoom r = ddp::memory_room();
  ASSERT_GT(r.free, 0) << r.what;
  EXPECT_GE(r.limit, r.free);
  EXPECT_FALSE(r.what.empty());
}

// The GPU build's start-up line (compiled there, not yet run on a GPU): where the
// optimizer state and activations to come exceed the device's free memory, one line
// naming the rank (the lowest of those sharing the GPU), the GPU, both parts, the
// free and the total; nothing where they fit or the free memory is unknown.
TEST(ShortOnDevice, NamesTheRankTheGpuAndBothParts) {
  const std::int64_t GiB = 1024 * MiB;
  EXPECT_EQ(ddp::short_on_device(3, 1, "GPU 0000:3B:00.0", 1 * GiB, 2 * GiB, 3 * GiB, 80 * GiB), "");
  EXPECT_EQ(ddp::short_on_device(3, 1, "GPU 0000:3B:00.0", 1 * GiB, 2 * GiB, -1, -1), "");
  EXPECT_EQ(ddp::short_on_device(3, 1, "GPU 0000:3B:00.0", 1 * GiB, 70 * GiB, 64 * GiB, 80 * GiB),
            "the run needs 72704.0 MiB more on rank 3's GPU 0000:3B:00.0 (optimizer state 1024.0 MiB and "
            "activations 71680.0 MiB, as the memory line counts them) and 65536.0 MiB of its 81920.0 MiB is "
            "free: lower train.batch_size, set comm.zero = 1, or run on GPUs with more memory");
  // Ranks sharing the GPU: their sums, held by the lowest of them.
  EXPECT_EQ(
      ddp::short_on_device(2, 3, "GPU 0000:3B:00.0", 3 * GiB, 30 * GiB, 32 * GiB, 80 * GiB),
      "the run needs 33792.0 MiB more on the GPU 0000:3B:00.0 that rank 2 and 2 other rank(s) share "
      "(optimizer state 3072.0 MiB and activations 30720.0 MiB, as the memory line counts them) and "
      "32768.0 MiB of its 81920.0 MiB is free: lower train.batch_size, set comm.zero = 1, or run on GPUs "
      "with more memory");
}

}  // namespace
