#include "comm/backend.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "comm/check.hpp"

namespace ddp {

const char* backend_name(Backend b) { return b == Backend::Nccl ? "nccl" : "mpi"; }

CommChoice choose_comm(const std::string& requested, bool nccl_available, bool device_buffers,
                       bool mpi_cuda_aware) {
  if (requested != "auto" && requested != "nccl" && requested != "mpi")
    throw InputError("comm.backend = '" + requested + "': expected 'auto', 'nccl' or 'mpi'");
  if (requested == "nccl") {
    if (!nccl_available)
      throw InputError(
          "comm.backend = 'nccl' but NCCL is not available here (a build without the CUDA glue, "
          "or no CUDA device visible to this rank): use 'mpi' or 'auto'");
    if (!device_buffers)
      throw InputError(
          "comm.backend = 'nccl' but the tensors live in host memory (Kokkos without CUDA): "
          "use 'mpi' or 'auto'");
  }
  CommChoice c;
  if (requested == "nccl" || (requested == "auto" && nccl_available && device_buffers)) {
    c.backend = Backend::Nccl;
    c.reason = "NCCL on device buffers" + std::string(requested == "auto" ? " (auto: GPU and NCCL)" : "");
    return c;
  }
  c.backend = Backend::Mpi;
  c.device_direct = device_buffers && mpi_cuda_aware;
  c.stage_through_host = device_buffers && !mpi_cuda_aware;
  if (!device_buffers)
    c.reason = "MPI on host buffers";
  else if (mpi_cuda_aware)
    c.reason = "MPI on device buffers (MPI is CUDA-aware)";
  else
    c.reason = "MPI, device buffers staged through pinned host memory (MPI is not CUDA-aware)";
  if (requested == "auto") c.reason += !device_buffers ? " (auto: no device buffers)" : " (auto: no NCCL)";
  return c;
}

Backend choose_backend(const std::string& requested, bool nccl_available, bool device_buffers,
                       bool mpi_cuda_aware, std::string* reason) {
  CommChoice c = choose_comm(requested, nccl_available, device_buffers, mpi_cuda_aware);
  if (reason) *reason = c.reason;
  return c.backend;
}

DeviceChoice pick_device(int device_count, int local_rank, const char* slurm_localid) {
  DeviceChoice d;
  if (device_count <= 0) {
    d.reason = "no CUDA device";
    return d;
  }
  if (device_count == 1) {
    d.device = 0;
    d.reason = "device 0, the one visible to this rank";
    return d;
  }
  int local = local_rank;
  std::string from = "local rank ";
  if (slurm_localid && *slurm_localid) {
    char* end = nullptr;
    long v = std::strtol(slurm_localid, &end, 10);
    if (*end == '\0' && v >= 0 && v <= INT_MAX) {
      local = int(v);
      from = "SLURM_LOCALID ";
    }
  }
  d.device = local % device_count;
  d.reason = "device " + std::to_string(d.device) + " of " + std::to_string(device_count) + " (" + from +
             std::to_string(local) + ")";
  return d;
}

void broadcast_bytes(MPI_Comm comm, void* data, std::size_t n, int root) {
  constexpr std::size_t piece = std::size_t(1) << 30;
  auto* p = static_cast<char*>(data);
  for (std::size_t off = 0; off < n; off += piece)
    MPI_CHECK(MPI_Bcast(p + off, int(std::min(piece, n - off)), MPI_BYTE, root, comm));
}

void bootstrap_id(MPI_Comm comm, void* id, std::size_t n, const std::function<void(void*)>& make_id) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  // A failure inside make_id aborts the job (the check family), so the other ranks
  // are not left waiting in the broadcast.
  if (rank == 0) make_id(id);
  broadcast_bytes(comm, id, n, 0);
}

}  // namespace ddp
