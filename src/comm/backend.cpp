#include "comm/backend.hpp"

#include <algorithm>

#include "comm/check.hpp"
#include "comm/watchdog.hpp"

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
  } else {
    d.device = local_rank % device_count;
    d.reason = "device " + std::to_string(d.device) + " of " + std::to_string(device_count) + " (local rank " +
               std::to_string(local_rank) + ")";
  }
  if (slurm_localid && *slurm_localid && slurm_localid != std::to_string(local_rank))
    d.reason += "; SLURM_LOCALID=" + std::string(slurm_localid) +
                " differs from MPI's node-local rank " + std::to_string(local_rank) +
                " (mpirun inside an allocation passes on the batch step's), not used";
  return d;
}

std::string shared_gpus(const std::vector<HeldGpu>& held, const std::vector<int>& ranks) {
  std::string text;
  std::vector<bool> named(held.size(), false);
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (named[i] || held[i].bus_id.empty()) continue;
    std::vector<int> holders = {ranks[i]};
    for (std::size_t j = i + 1; j < held.size(); ++j)
      if (!named[j] && held[j].bus_id == held[i].bus_id && held[j].nccl_host == held[i].nccl_host) {
        named[j] = true;
        holders.push_back(ranks[j]);
      }
    if (holders.size() < 2) continue;
    std::string who;
    for (std::size_t k = 0; k < holders.size(); ++k)
      who += (k == 0 ? "" : k + 1 == holders.size() ? " and " : ", ") + std::to_string(holders[k]);
    text += (text.empty() ? "" : "; ") + std::string("ranks ") + who + " hold GPU " + held[i].bus_id;
  }
  return text;
}

std::string gpus_shared_on_nodes(MPI_Comm comm, const HeldGpu& mine) {
  // Fixed-size records: a bus id is 12 to 16 characters, NCCL_HOSTID is cut at 255.
  constexpr std::size_t kBus = 64, kHost = 256, kRecord = kBus + kHost;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local_size = 1;
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  std::vector<char> record(kRecord, '\0'), all(kRecord * std::size_t(local_size));
  mine.bus_id.copy(record.data(), kBus - 1);
  mine.nccl_host.copy(record.data() + kBus, kHost - 1);
  std::vector<int> ranks(static_cast<std::size_t>(local_size));
  {
    const watchdog::Collective guard("the gather of the node's GPUs (MPI_Allgather)");
    MPI_CHECK(MPI_Allgather(record.data(), int(kRecord), MPI_CHAR, all.data(), int(kRecord), MPI_CHAR, node));
    MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node));
  }
  MPI_CHECK(MPI_Comm_free(&node));
  std::vector<HeldGpu> held(static_cast<std::size_t>(local_size));
  for (std::size_t i = 0; i < held.size(); ++i) {
    held[i].bus_id = all.data() + i * kRecord;
    held[i].nccl_host = all.data() + i * kRecord + kBus;
  }
  return first_words(comm, shared_gpus(held, ranks));
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
