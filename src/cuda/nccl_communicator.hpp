#pragma once
// ddp::Communicator over NCCL, on device buffers. Rank 0's ncclUniqueId reaches the
// others by MPI_Bcast (ddp::bootstrap_id). Collectives run on the communicator's own
// stream, ordered against the caller's compute stream by events in both directions:
// a collective starts after the compute work queued before it and the compute work
// queued after it waits for it. The host waits on NCCL work only in wait_device
// (once a step, after the step's last kernel is queued; the epoch's end), barrier()
// and synchronize(), each inside a watchdog::Collective, so that the hang watchdog
// names the ranks that did not arrive; each polls ncclCommGetAsyncError, and a fatal
// error on any thread (the watchdog's line among them) aborts the communicator
// (ncclCommAbort) before MPI_Abort where the main thread waits in one of them. Host
// arrays are summed by MPI.

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.hpp"

namespace ddp::cuda {

class NcclCommunicator final : public Communicator {
 public:
  struct Options {
    double timeout_s = 600;  // a wait longer than this is a hang: abort with the rank and operation
  };

  // Collective over `comm`; the device must already be bound (bind_device).
  NcclCommunicator(MPI_Comm comm, cudaStream_t compute, Options options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Device pointers, in place; queued, not waited for.
  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(double* data, std::size_t n) override;
  void broadcast(float* data, std::size_t n, int root) override;
  // Host arrays (flags, metric sums): MPI_Allreduce, under the watchdog; no device copy.
  void allreduce_sum_host(double* data, std::size_t n) override;
  void allreduce_sum_host_waiting(double* data, std::size_t n) override;
  // The host waits for the compute stream's work queued so far, collectives included.
  void wait_device(const char* what) override;
  // Every rank's queued collectives done (a one-element all-reduce, then a wait).
  void barrier() override;
  MPI_Comm mpi_comm() const override { return mpi_comm_; }
  bool captures_collectives() const override { return true; }
  // NcclBucketReducer: each bucket starts on the NCCL stream when backward has made
  // it, and the compute stream waits for all of them only at finish().
  // (Device buffers: shared_memory does not apply.) scatter_to: each bucket goes to
  // the shares' owners, one ncclReduce per share it touches, in one group.
  std::unique_ptr<BucketReducer> make_bucket_reducer(float* grads, std::vector<Bucket> buckets,
                                                     const std::string& overlap, bool shared_memory,
                                                     const std::vector<std::int64_t>& scatter_to) override;
  // ZeRO: one ncclBroadcast per share from its owner / one ncclReduce per share to its
  // owner, in one group (the shares differ in size: ncclAllGather and
  // ncclReduceScatter take equal ones).
  void allgather_shares(float* data, const std::vector<std::int64_t>& bounds) override;
  void reduce_scatter_shares(float* data, const std::vector<std::int64_t>& bounds) override;
  // reduce_scatter_shares of data[begin, end) only, detached as allreduce_sum_detached.
  void reduce_to_shares_detached(float* data, std::int64_t begin, std::int64_t end,
                                 const std::vector<std::int64_t>& bounds);

  // An all-reduce that starts after the compute work queued so far but that the
  // compute stream does not wait for, until join(): the buckets of backward.
  void allreduce_sum_detached(float* data, std::size_t n);
  // The compute stream waits for every collective queued so far.
  void join();

  // recv (recv_count) = this rank's slice of the sum over ranks of send (size * recv_count).
  void reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count);
  // recv (size * send_count) = the concatenation in rank order of every rank's send (send_count).
  void all_gather(const float* send, float* recv, std::size_t send_count);

  // Wait, under the watchdog, until the collectives queued so far have completed.
  void synchronize();
  // ncclCommAbort, once, if the main thread waits in poll() (the abort hook; any thread).
  void abort();
  cudaStream_t stream() const { return stream_; }

 private:
  // join: the compute stream waits for this collective (else only join() makes it).
  template <class Call>
  void enqueue(const char* op, std::size_t n, const char* type, Call&& call, bool join = true);
  // The host waits until `event` completes, inside watchdog::Collective(what) (a string
  // literal), polling NCCL's asynchronous error. Its own deadline, options_.timeout_s,
  // only where no Watchdog runs: the watchdog's knows more.
  void poll(cudaEvent_t event, const char* what);
  // ncclCommDestroy, bounded: see the definition.
  void destroy();

  ncclComm_t comm_ = nullptr;
  MPI_Comm mpi_comm_ = MPI_COMM_NULL;  // a duplicate of the constructor's communicator
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // compute -> NCCL, NCCL -> compute
  // done_ was last recorded while the stream was captured into a CUDA graph
  // (train.cuda_graph): outside that capture CUDA refuses to query or wait on it.
  bool done_in_capture_ = false;
  cudaEvent_t host_wait_ = nullptr;     // wait_device's, on the compute stream
  float* scratch_ = nullptr;            // barrier()'s one element
  std::unique_ptr<Communicator> host_;  // MPI, for allreduce_sum_host
  std::mutex abort_mutex_;              // abort() against poll()'s NCCL calls
  bool aborted_ = false;
  bool in_poll_ = false;  // the main thread waits in poll()
  int rank_ = 0, size_ = 1;
  Options options_;
  std::string last_op_ = "none";  // named by the watchdog
};

}  // namespace ddp::cuda
