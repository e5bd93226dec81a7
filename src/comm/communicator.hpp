#pragma once
// Collectives over the ranks of a run. The backend is chosen once, at
// construction; callers never branch on it: MPI on host buffers (the CPU build),
// or on a GPU NCCL or MPI on device buffers (src/cuda/device_communicator.hpp).
//
// Buffers are in the memory space the tensors live in (Kokkos's default: host
// memory in the CPU build, device memory in the CUDA build), except where a name
// says _host.

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"

namespace ddp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = sum over ranks of data[i]. On a GPU queued on the compute
  // stream's order, not waited for.
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void allreduce_sum(double* data, std::size_t n) = 0;
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  // The same on a small host array (flags, metric sums), done when it returns.
  virtual void allreduce_sum_host(double* data, std::size_t n) = 0;
  virtual void barrier() = 0;
  // The bucketed gradient all-reduce of this backend over `grads` (n floats in the
  // tensors' memory space), overlapping backward: overlap = 'poll' | 'thread' (MPI
  // progress modes; NCCL progresses on its own stream whatever is asked). With
  // shared_memory, host buffers and every rank on one node, the sums are made in a
  // shared window instead (comm/shm_reducer.hpp; overlap does not apply). Null when
  // the backend has none: the trainer then all-reduces after backward. Collective.
  virtual std::unique_ptr<BucketReducer> make_bucket_reducer(float* grads, std::vector<Bucket> buckets,
                                                             const std::string& overlap,
                                                             bool shared_memory) = 0;
  // The same ranks as an MPI communicator, for MPI-level helpers (the bucketed
  // gradient reducer makes its own duplicate of it).
  virtual MPI_Comm mpi_comm() const = 0;
};

// MPI on host buffers, over a private duplicate of `comm`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ddp
