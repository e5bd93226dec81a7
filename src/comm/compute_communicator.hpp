#pragma once
// The communicator for the buffers the tensors live in, of the build's kind: MPI on
// host buffers in the CPU build; in the CUDA build NCCL, or MPI on device buffers
// (CUDA-aware, or staged through pinned host memory), ordered on Kokkos's stream.

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/backend.hpp"
#include "comm/communicator.hpp"

namespace ddp {

// requested: comm.backend, 'auto' | 'nccl' | 'mpi'; timeout_s: how long a NCCL
// wait may last before it counts as a hang. `choice` (optional) receives what was
// chosen and why. Throws InputError for a backend this build or machine cannot
// run (ddp::choose_comm). Collective over `comm`.
std::unique_ptr<Communicator> make_compute_communicator(MPI_Comm comm, const std::string& requested = "auto",
                                                        double timeout_s = 600.0,
                                                        CommChoice* choice = nullptr);

}  // namespace ddp
