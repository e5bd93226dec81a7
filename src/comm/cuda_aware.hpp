#pragma once
// Whether the MPI library accepts device (CUDA) pointers. Asked of MPI with
// MPIX_Query_cuda_support (Open MPI's <mpi-ext.h>, MPICH >= 4); an MPI without
// the query counts as not CUDA-aware, and device buffers are then staged through
// pinned host memory. DDP_MPI_CUDA_AWARE=1 or 0 in the environment overrides
// the answer, for MPIs that support CUDA but not the query (Cray MPICH with
// MPICH_GPU_SUPPORT_ENABLED=1) or to force staging.

#include <string>

namespace ddp {

// `how` (optional) receives where the answer came from, for the start-up log.
bool mpi_cuda_aware(std::string* how = nullptr);

}  // namespace ddp
