#pragma once
// How a rank talks and where it runs: the communication backend (`&comm backend`),
// whether device buffers go to MPI directly or through pinned host memory, the GPU
// a rank binds to, and the NCCL unique-id bootstrap over MPI. Plain C++ and MPI,
// so all of it is tested on the CPU; the CUDA glue (src/cuda) acts on the answers.

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace ddp {

enum class Backend { Mpi, Nccl };

const char* backend_name(Backend b);  // "mpi", "nccl"

struct CommChoice {
  Backend backend = Backend::Mpi;
  // MPI backend only: device buffers handed to MPI as they are (MPI is CUDA-aware)...
  bool device_direct = false;
  // ...or copied to pinned host memory, reduced there and copied back.
  bool stage_through_host = false;
  std::string reason;  // one line for the start-up log
};

// requested: `comm.backend`, 'auto' | 'nccl' | 'mpi'.
// nccl_available: this build has NCCL (DDP_WITH_CUDA_GLUE) and the rank bound a GPU.
// device_buffers: gradients live in device memory (a CUDA Kokkos).
// mpi_cuda_aware: mpi_cuda_aware() below.
// 'auto' picks NCCL when it can (NCCL and device buffers), MPI otherwise. 'nccl'
// when NCCL cannot run, or an unknown name, throws InputError naming comm.backend.
CommChoice choose_comm(const std::string& requested, bool nccl_available, bool device_buffers,
                       bool mpi_cuda_aware);
// The backend alone; `reason` (optional) receives CommChoice::reason.
Backend choose_backend(const std::string& requested, bool nccl_available, bool device_buffers,
                       bool mpi_cuda_aware, std::string* reason);

// The GPU a rank binds to. device_count: what cudaGetDeviceCount reports (<= 0: none,
// or it failed). local_rank: MPI's node-local rank (Context::local_rank), the one
// source. One visible device (Slurm's --gpus-per-task / --gpu-bind, or a
// CUDA_VISIBLE_DEVICES set per rank) means device 0; otherwise node-local rank modulo
// the device count. slurm_localid: $SLURM_LOCALID or nullptr, a cross-check only:
// under mpirun inside an sbatch allocation every rank inherits the batch step's
// SLURM_LOCALID=0, so a value that differs from the local rank is named in the reason,
// never followed. -1 without a device.
struct DeviceChoice {
  int device = -1;
  std::string reason;  // "no CUDA device (...)", "device 1 of 4 (local rank 5)", ...
};
DeviceChoice pick_device(int device_count, int local_rank, const char* slurm_localid);

// What a rank holds once bound: its GPU's PCI bus id ("0000:3B:00.0"; "" for none)
// and the host NCCL sees it on ($NCCL_HOSTID, or "" for the node itself: NCCL tells
// hosts apart by that variable where it is set, by the host's name otherwise).
struct HeldGpu {
  std::string bus_id;
  std::string nccl_host;
};

// Which ranks of one node hold the same GPU, the only case in which ranks share one:
// never decided by counts, since Slurm's --gpus-per-task shows each of 8 ranks one GPU
// of 8. held[i]: node-local rank i's; ranks[i]: its rank in the job. Two ranks share
// when both bus id and NCCL's host are equal (NCCL then refuses them: its duplicate-GPU
// check is per host). "" where none share; else "ranks 0 and 8 hold GPU 0000:3B:00.0",
// every such GPU named, "; " between them.
std::string shared_gpus(const std::vector<HeldGpu>& held, const std::vector<int>& ranks);

// shared_gpus over the ranks of each node of `comm` (MPI_Comm_split_type), `mine` this
// rank's: the lowest rank's non-empty text ("" where no node has ranks sharing a GPU),
// the same on every rank. Collective, under the watchdog.
std::string gpus_shared_on_nodes(MPI_Comm comm, const HeldGpu& mine);

// Broadcast n bytes from `root`, any n (MPI's int counts: in pieces of 2^30).
void broadcast_bytes(MPI_Comm comm, void* data, std::size_t n, int root);
// The NCCL bootstrap without NCCL: rank 0 fills the n bytes at `id` with make_id
// (ncclGetUniqueId), and every rank returns with rank 0's bytes. Collective.
void bootstrap_id(MPI_Comm comm, void* id, std::size_t n, const std::function<void(void*)>& make_id);

}  // namespace ddp
