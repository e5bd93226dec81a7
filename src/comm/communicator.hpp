#pragma once
// Collectives over the ranks of a run. The backend is chosen once, at
// construction; callers never branch on it. This issue brings the MPI backend
// (host buffers); NCCL comes with the GPU path.

#include <mpi.h>

#include <cstddef>
#include <memory>

namespace ddp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = sum over ranks of data[i].
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void allreduce_sum(double* data, std::size_t n) = 0;
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  virtual void barrier() = 0;
  // The same ranks as an MPI communicator, for MPI-level helpers (the bucketed
  // gradient reducer makes its own duplicate of it).
  virtual MPI_Comm mpi_comm() const = 0;
};

// MPI on host buffers, over a private duplicate of `comm`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ddp
