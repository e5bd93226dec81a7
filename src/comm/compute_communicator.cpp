#include "comm/compute_communicator.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>

#include "comm/check.hpp"
#include "comm/cuda_aware.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/device.hpp"
#include "cuda/device_communicator.hpp"
#endif

namespace ddp {

std::unique_ptr<Communicator> make_compute_communicator(MPI_Comm comm, const std::string& requested,
                                                        double timeout_s, CommChoice* choice) {
#if defined(KOKKOS_ENABLE_CUDA)
  // The rank's GPU is bound (Context), and gradients live on it. NCCL runs one rank
  // per GPU: ranks that hold the same GPU (by its bus id, as NCCL sees them) cannot
  // use it. How many GPUs a rank sees says nothing: under --gpus-per-task each sees one.
  HeldGpu mine;
  mine.bus_id = cuda::current_bus_id();
  if (const char* host = std::getenv("NCCL_HOSTID")) mine.nccl_host = host;
  const std::string shared = gpus_shared_on_nodes(comm, mine);
  if (!shared.empty() && requested == "nccl")
    throw InputError("comm.backend = 'nccl' but " + shared +
                     " and NCCL needs a GPU of its own for each rank: use 'mpi' or 'auto', or one rank per GPU");
  CommChoice c = choose_comm(requested, /*nccl_available=*/shared.empty(), /*device_buffers=*/true,
                             mpi_cuda_aware(nullptr));
  if (!shared.empty() && requested == "auto") c.reason += ": " + shared + " and NCCL needs a GPU of its own for each rank";
  if (choice) *choice = c;
  cuda::NcclCommunicator::Options options;
  options.timeout_s = timeout_s;
  return cuda::make_device_communicator(c, comm, Kokkos::DefaultExecutionSpace().cuda_stream(), options);
#else
  (void)timeout_s;
  const CommChoice c =
      choose_comm(requested, /*nccl_available=*/false, /*device_buffers=*/false, mpi_cuda_aware(nullptr));
  if (choice) *choice = c;
  return make_mpi_communicator(comm);
#endif
}

}  // namespace ddp
