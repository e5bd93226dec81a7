#pragma once
// The communicator for gradients in device memory, of the backend chosen once by
// ddp::choose_comm: NCCL, or MPI on the device buffers directly (CUDA-aware MPI),
// or MPI on a pinned host copy.

#include <cuda_runtime.h>
#include <mpi.h>

#include <memory>

#include "comm/backend.hpp"
#include "comm/communicator.hpp"
#include "cuda/nccl_communicator.hpp"

namespace ddp::cuda {

// MPI on device buffers. MPI knows no streams, so every call first waits for the
// compute stream; with `stage` the data go device -> pinned host -> MPI -> device.
std::unique_ptr<Communicator> make_device_mpi_communicator(MPI_Comm comm, cudaStream_t compute, bool stage);

// choice.backend == Nccl: NcclCommunicator; Mpi: make_device_mpi_communicator with
// choice.stage_through_host. Collective.
std::unique_ptr<Communicator> make_device_communicator(const CommChoice& choice, MPI_Comm comm,
                                                       cudaStream_t compute,
                                                       NcclCommunicator::Options nccl_options);

}  // namespace ddp::cuda
