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
  // ZeRO (comm/shares.hpp), in place on the flat buffer `data` of bounds.back()
  // floats, in the tensors' memory space:
  // - allgather_shares: rank r's share [bounds[r], bounds[r + 1]) as rank r holds it,
  //   to every rank (MPI_Allgatherv; on a GPU one broadcast per share);
  // - reduce_scatter_shares: this rank's share becomes the sum over the ranks of
  //   their values there (MPI_Reduce_scatter; on a GPU one reduce per share); the
  //   rest of `data` is undefined after it.
  // On a GPU queued on the compute stream's order, as allreduce_sum.
  virtual void allgather_shares(float* data, const std::vector<std::int64_t>& bounds) = 0;
  virtual void reduce_scatter_shares(float* data, const std::vector<std::int64_t>& bounds) = 0;
  // The same on a small host array (flags, metric sums), done when it returns.
  virtual void allreduce_sum_host(double* data, std::size_t n) = 0;
  // The same for sums a rank may wait seconds in while another writes a checkpoint or
  // validates longer: the core given back through a long wait where the communicator
  // can (MPI's: mpi_wait.hpp); allreduce_sum_host where not. The step's own flags go
  // through allreduce_sum_host: MPI_Allreduce, whose latency the step feels.
  virtual void allreduce_sum_host_waiting(double* data, std::size_t n) { allreduce_sum_host(data, n); }
  virtual void barrier() = 0;
  // The host waits for the device work queued so far on the compute stream, the
  // collectives it waits for included, as if in the collective `what` (a string
  // literal) for the hang watchdog: NCCL's collectives, queued on streams, are waited
  // for here, polling NCCL's errors. MPI's calls wait in themselves: nothing to do
  // (the caller's fence or copy then waits for the kernels alone).
  virtual void wait_device(const char* /*what*/) {}
  // The bucketed gradient all-reduce of this backend over `grads` (n floats in the
  // tensors' memory space), overlapping backward: overlap = 'poll' | 'thread' (MPI
  // progress modes; NCCL progresses on its own stream whatever is asked). With
  // shared_memory, host buffers and every rank on one node, the sums are made in a
  // shared window instead (comm/shm_reducer.hpp; overlap does not apply). Null when
  // the backend has none: the trainer then all-reduces after backward. scatter_to
  // (comm.zero = 2): the share bounds; each bucket is then reduce-scattered, and a
  // rank ends with the sums of its share only (reduce_scatter_shares, by bucket).
  // Collective.
  virtual std::unique_ptr<BucketReducer> make_bucket_reducer(float* grads, std::vector<Bucket> buckets,
                                                             const std::string& overlap, bool shared_memory,
                                                             const std::vector<std::int64_t>& scatter_to) = 0;
  // The same ranks as an MPI communicator, for MPI-level helpers (the bucketed
  // gradient reducer makes its own duplicate of it).
  virtual MPI_Comm mpi_comm() const = 0;
  // Whether its collectives on device buffers (allreduce_sum, the bucket reducer's)
  // only queue work on the compute stream and the streams that join it, with no host
  // wait, so that a CUDA graph of the step can capture them (NCCL).
  virtual bool captures_collectives() const { return false; }
};

// MPI on host buffers, over a private duplicate of `comm`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ddp
