// Communication backend choice, the staging decision, device binding and the NCCL
// unique-id bootstrap: the parts of the GPU path that need no GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "comm/check.hpp"
#include "comm/cuda_aware.hpp"

namespace {

using ddp::Backend;

struct Row {
  const char* requested;
  bool nccl, device, aware;
  bool error;
  Backend backend;
  bool direct, stage;
};

// Every combination of (requested, NCCL available, device buffers, MPI CUDA-aware).
const Row kTable[] = {
    // requested nccl  device aware  error  backend        direct stage
    {"auto", false, false, false, false, Backend::Mpi, false, false},
    {"auto", false, false, true, false, Backend::Mpi, false, false},
    {"auto", false, true, false, false, Backend::Mpi, false, true},
    {"auto", false, true, true, false, Backend::Mpi, true, false},
    {"auto", true, false, false, false, Backend::Mpi, false, false},
    {"auto", true, false, true, false, Backend::Mpi, false, false},
    {"auto", true, true, false, false, Backend::Nccl, false, false},
    {"auto", true, true, true, false, Backend::Nccl, false, false},
    {"nccl", false, false, false, true, Backend::Mpi, false, false},
    {"nccl", false, false, true, true, Backend::Mpi, false, false},
    {"nccl", false, true, false, true, Backend::Mpi, false, false},
    {"nccl", false, true, true, true, Backend::Mpi, false, false},
    {"nccl", true, false, false, true, Backend::Mpi, false, false},
    {"nccl", true, false, true, true, Backend::Mpi, false, false},
    {"nccl", true, true, false, false, Backend::Nccl, false, false},
    {"nccl", true, true, true, false, Backend::Nccl, false, false},
    {"mpi", false, false, false, false, Backend::Mpi, false, false},
    {"mpi", false, false, true, false, Backend::Mpi, false, false},
    {"mpi", false, true, false, false, Backend::Mpi, false, true},
    {"mpi", false, true, true, false, Backend::Mpi, true, false},
    {"mpi", true, false, false, false, Backend::Mpi, false, false},
    {"mpi", true, false, true, false, Backend::Mpi, false, false},
    {"mpi", true, true, false, false, Backend::Mpi, false, true},
    {"mpi", true, true, true, false, Backend::Mpi, true, false},
};

TEST(Backend, EveryCombination) {
  for (const Row& r : kTable) {
    SCOPED_TRACE(std::string(r.requested) + " nccl=" + std::to_string(r.nccl) +
                 " device=" + std::to_string(r.device) + " aware=" + std::to_string(r.aware));
    if (r.error) {
      try {
        ddp::choose_comm(r.requested, r.nccl, r.device, r.aware);
        ADD_FAILURE() << "expected an InputError";
      } catch (const ddp::InputError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("comm.backend = 'nccl' but ", 0), 0u) << e.what();
      }
      continue;
    }
    ddp::CommChoice c = ddp::choose_comm(r.requested, r.nccl, r.device, r.aware);
    EXPECT_EQ(c.backend, r.backend);
    EXPECT_EQ(c.device_direct, r.direct);
    EXPECT_EQ(c.stage_through_host, r.stage);
    EXPECT_FALSE(c.reason.empty());
    std::string reason;
    EXPECT_EQ(ddp::choose_backend(r.requested, r.nccl, r.device, r.aware, &reason), r.backend);
    EXPECT_EQ(reason, c.reason);
  }
}

TEST(Backend, NcclErrorsSayWhy) {
  try {
    ddp::choose_comm("nccl", false, true, false);
    FAIL();
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL is not available"), std::string::npos) << e.what();
  }
  try {
    ddp::choose_comm("nccl", true, false, false);
    FAIL();
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

TEST(Backend, UnknownNameIsAnInputError) {
  for (const char* name : {"", "NCCL", "gloo", "auto "}) {
    try {
      ddp::choose_comm(name, true, true, true);
      ADD_FAILURE() << "'" << name << "' accepted";
    } catch (const ddp::InputError& e) {
      EXPECT_EQ(std::string(e.what()),
                "comm.backend = '" + std::string(name) + "': expected 'auto', 'nccl' or 'mpi'");
    }
  }
  EXPECT_STREQ(ddp::backend_name(Backend::Nccl), "nccl");
  EXPECT_STREQ(ddp::backend_name(Backend::Mpi), "mpi");
}

TEST(Device, NoDevice) {
  for (int count : {0, -1}) {
    ddp::DeviceChoice d = ddp::pick_device(count, 3, "3");
    EXPECT_EQ(d.device, -1);
    EXPECT_EQ(d.reason, "no CUDA device");
  }
}

TEST(Device, OneVisibleDeviceIsDeviceZero) {
  // Slurm's --gpus-per-task=1 / --gpu-bind, or CUDA_VISIBLE_DEVICES set per rank.
  for (int local : {0, 1, 7}) EXPECT_EQ(ddp::pick_device(1, local, std::to_string(local).c_str()).device, 0);
  EXPECT_EQ(ddp::pick_device(1, 5, nullptr).device, 0);
}

TEST(Device, LocalRankModuloCount) {
  EXPECT_EQ(ddp::pick_device(4, 0, nullptr).device, 0);
  EXPECT_EQ(ddp::pick_device(4, 3, nullptr).device, 3);
  EXPECT_EQ(ddp::pick_device(4, 5, nullptr).device, 1);
  EXPECT_EQ(ddp::pick_device(4, 5, "").device, 1);
  ddp::DeviceChoice d = ddp::pick_device(4, 6, nullptr);
  EXPECT_EQ(d.reason, "device 2 of 4 (local rank 6)");
}

TEST(Device, LocalRankWinsOverSlurmLocalId) {
  // mpirun inside an sbatch allocation: every rank inherits the batch step's SLURM_LOCALID=0.
  for (int local = 0; local < 4; ++local) {
    ddp::DeviceChoice d = ddp::pick_device(4, local, "0");
    EXPECT_EQ(d.device, local);
    if (local == 0) {
      EXPECT_EQ(d.reason, "device 0 of 4 (local rank 0)");
    } else {
      EXPECT_EQ(d.reason, "device " + std::to_string(local) + " of 4 (local rank " + std::to_string(local) +
                              "); SLURM_LOCALID=0 differs from MPI's node-local rank " + std::to_string(local) +
                              " (mpirun inside an allocation passes on the batch step's), not used");
    }
  }
  EXPECT_EQ(ddp::pick_device(2, 0, "5").device, 0);
  EXPECT_EQ(ddp::pick_device(4, 2, "x1").device, 2);
  EXPECT_EQ(ddp::pick_device(4, 2, "-1").device, 2);
  // srun: SLURM_LOCALID is the local rank, nothing to say.
  EXPECT_EQ(ddp::pick_device(4, 3, "3").reason, "device 3 of 4 (local rank 3)");
}

// Stand-in tables of what each node-local rank holds.
std::vector<ddp::HeldGpu> held_on(const std::vector<int>& devices, const std::string& nccl_host_prefix = "") {
  std::vector<ddp::HeldGpu> held;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    char bus[32];
    std::snprintf(bus, sizeof bus, "0000:%02X:00.0", 0x18 + 0x10 * devices[i]);
    held.push_back({bus, nccl_host_prefix.empty() ? "" : nccl_host_prefix + std::to_string(i)});
  }
  return held;
}

std::vector<int> iota_ranks(int n, int first = 0) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(first + i);
  return r;
}

TEST(Device, EightRanksEachSeeingOneGpuShareNone) {
  // --gpus-per-task=1: each of 8 ranks sees one GPU, its own, as CUDA device 0.
  std::vector<int> devices;
  for (int local = 0; local < 8; ++local) {
    EXPECT_EQ(ddp::pick_device(1, local, std::to_string(local).c_str()).device, 0);
    devices.push_back(local);  // the node's GPU behind it: Slurm gave each task another
  }
  EXPECT_EQ(ddp::shared_gpus(held_on(devices), iota_ranks(8)), "");
}

TEST(Device, EightRanksSeeingEightGpusTakeOneEach) {
  std::vector<int> devices;
  for (int local = 0; local < 8; ++local) {
    const ddp::DeviceChoice d = ddp::pick_device(8, local, nullptr);
    EXPECT_EQ(d.device, local);
    devices.push_back(d.device);
  }
  EXPECT_EQ(ddp::shared_gpus(held_on(devices), iota_ranks(8, 8)), "");  // the job's second node
}

TEST(Device, SixteenRanksOnEightGpusAreNamed) {
  std::vector<int> devices;
  for (int local = 0; local < 16; ++local) devices.push_back(ddp::pick_device(8, local, nullptr).device);
  const std::string text = ddp::shared_gpus(held_on(devices), iota_ranks(16));
  EXPECT_EQ(text.rfind("ranks 0 and 8 hold GPU 0000:18:00.0; ranks 1 and 9 hold GPU 0000:28:00.0; ", 0), 0u)
      << text;
  EXPECT_NE(text.find("; ranks 7 and 15 hold GPU 0000:88:00.0"), std::string::npos) << text;
  // Three on one GPU, the others alone.
  EXPECT_EQ(ddp::shared_gpus(held_on({0, 1, 0, 2, 0}), {4, 5, 6, 7, 8}), "ranks 4, 6 and 8 hold GPU 0000:18:00.0");
  EXPECT_EQ(ddp::shared_gpus({{"", ""}, {"", ""}}, {0, 1}), "");  // no GPU held: nothing shared
}

TEST(Device, OwnNcclHostIdPerRankIsNotSharing) {
  // NCCL_HOSTID=host<rank> on one GPU (the tests' multi-rank NCCL): NCCL sees a host per rank.
  EXPECT_EQ(ddp::shared_gpus(held_on({0, 0, 0, 0}, "host"), iota_ranks(4)), "");
  // The same NCCL_HOSTID everywhere is one host again.
  std::vector<ddp::HeldGpu> same = held_on({0, 0});
  for (ddp::HeldGpu& h : same) h.nccl_host = "h";
  EXPECT_EQ(ddp::shared_gpus(same, {0, 1}), "ranks 0 and 1 hold GPU 0000:18:00.0");
}

TEST(Device, SharingIsGatheredOverTheNode) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every rank on this machine claims the same GPU: shared from 2 ranks on.
  const std::string all = ddp::gpus_shared_on_nodes(MPI_COMM_WORLD, {"0000:18:00.0", ""});
  std::string want;
  if (size > 1) {
    want = "ranks ";
    for (int r = 0; r < size; ++r) want += (r == 0 ? "" : r + 1 == size ? " and " : ", ") + std::to_string(r);
    want += " hold GPU 0000:18:00.0";
  }
  EXPECT_EQ(all, want);
  // Each its own, or each its own NCCL host: none.
  char bus[32];
  std::snprintf(bus, sizeof bus, "0000:%02X:00.0", 0x18 + rank);
  EXPECT_EQ(ddp::gpus_shared_on_nodes(MPI_COMM_WORLD, {bus, ""}), "");
  EXPECT_EQ(ddp::gpus_shared_on_nodes(MPI_COMM_WORLD, {"0000:18:00.0", "host" + std::to_string(rank)}), "");
  // Only the last two ranks share: every rank gets the same text.
  const bool pair = size > 2 && rank >= size - 2;
  std::snprintf(bus, sizeof bus, "0000:%02X:00.0", pair ? 0xF0 : 0x18 + rank);
  const std::string last_two = ddp::gpus_shared_on_nodes(MPI_COMM_WORLD, {bus, ""});
  EXPECT_EQ(last_two, size > 2 ? "ranks " + std::to_string(size - 2) + " and " + std::to_string(size - 1) +
                                     " hold GPU 0000:F0:00.0"
                               : "");
}

TEST(CudaAware, EnvironmentOverridesTheQuery) {
  std::string how;
  setenv("DDP_MPI_CUDA_AWARE", "1", 1);
  EXPECT_TRUE(ddp::mpi_cuda_aware(&how));
  EXPECT_EQ(how, "DDP_MPI_CUDA_AWARE=1");
  setenv("DDP_MPI_CUDA_AWARE", "0", 1);
  EXPECT_FALSE(ddp::mpi_cuda_aware(&how));
  EXPECT_EQ(how, "DDP_MPI_CUDA_AWARE=0");
  unsetenv("DDP_MPI_CUDA_AWARE");
}

TEST(CudaAware, QueryOrFallback) {
  unsetenv("DDP_MPI_CUDA_AWARE");
  std::string how;
  bool aware = ddp::mpi_cuda_aware(&how);
  // Either MPI was asked, or an MPI without the query counts as not CUDA-aware.
  if (how.rfind("MPIX_Query_cuda_support() = ", 0) == 0) {
    EXPECT_EQ(how.back() == '1', aware);
  } else {
    EXPECT_FALSE(aware) << how;
    EXPECT_NE(how.find("assumed not CUDA-aware"), std::string::npos) << how;
  }
  // Whatever it says feeds the staging decision.
  EXPECT_EQ(ddp::choose_comm("mpi", false, true, aware).stage_through_host, !aware);
}

TEST(Bootstrap, RankZeroIdReachesEveryRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int round = 0; round < 3; ++round) {
    // An ncclUniqueId is 128 opaque bytes (NCCL_UNIQUE_ID_BYTES); NUL bytes included.
    std::vector<unsigned char> id(128, 0xEE);
    int made = 0;
    ddp::bootstrap_id(MPI_COMM_WORLD, id.data(), id.size(), [&](void* out) {
      ++made;
      auto* bytes = static_cast<unsigned char*>(out);
      for (int i = 0; i < 128; ++i) bytes[i] = static_cast<unsigned char>((i * 37 + round * 11) % 256);
    });
    EXPECT_EQ(made, rank == 0 ? 1 : 0);
    for (int i = 0; i < 128; ++i)
      ASSERT_EQ(id[i], static_cast<unsigned char>((i * 37 + round * 11) % 256)) << i;
    int total = 0;
    MPI_Allreduce(&made, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total, 1);  // one id per communicator, made by rank 0 only
  }
}

TEST(Bootstrap, BroadcastBytesFromAnyRoot) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int root = size - 1;
  std::vector<char> buf(1000, rank == root ? 'r' : '?');
  ddp::broadcast_bytes(MPI_COMM_WORLD, buf.data(), buf.size(), root);
  EXPECT_EQ(std::string(buf.begin(), buf.end()), std::string(1000, 'r'));
}

}  // namespace
