#include "comm/compute_communicator.hpp"

#include <Kokkos_Core.hpp>

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
  // per GPU: where ranks of a node share one (more ranks than GPUs), it cannot.
  MPI_Comm node = MPI_COMM_NULL;
  int local_size = 1, rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  MPI_CHECK(MPI_Comm_free(&node));
  const int devices = cuda::device_count();
  int shared = local_size > devices ? 1 : 0, any_shared = 0;
  MPI_CHECK(MPI_Allreduce(&shared, &any_shared, 1, MPI_INT, MPI_MAX, comm));
  if (any_shared && requested == "nccl")
    throw InputError("comm.backend = 'nccl' but ranks share a GPU (" + std::to_string(local_size) +
                     " ranks on a node with " + std::to_string(devices) +
                     " GPU(s)) and NCCL needs one GPU per rank: use 'mpi' or 'auto', or one rank per GPU");
  CommChoice c = choose_comm(requested, /*nccl_available=*/!any_shared, /*device_buffers=*/true,
                             mpi_cuda_aware(nullptr));
  if (any_shared && requested == "auto")
    c.reason += ": ranks share a GPU (" + std::to_string(local_size) + " ranks, " + std::to_string(devices) +
                " GPU(s) on a node) and NCCL needs one GPU per rank";
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
