// Communication backend choice, the staging decision, device binding and the NCCL
// unique-id bootstrap: the parts of the GPU path that need no GPU.
#include <gtest/gtest.h>
#include <mpi.h>

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

TEST(Device, SlurmLocalIdWins) {
  ddp::DeviceChoice d = ddp::pick_device(4, 0, "3");
  EXPECT_EQ(d.device, 3);
  EXPECT_EQ(d.reason, "device 3 of 4 (SLURM_LOCALID 3)");
  EXPECT_EQ(ddp::pick_device(2, 0, "5").device, 1);
  // Not a number: the MPI node-local rank.
  EXPECT_EQ(ddp::pick_device(4, 2, "x1").device, 2);
  EXPECT_EQ(ddp::pick_device(4, 2, "-1").device, 2);
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
