#include "cuda/nccl_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/backend.hpp"
#include "comm/trace.hpp"
#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t compute, Options options)
    : compute_(compute), options_(options) {
  MPI_CHECK(MPI_Comm_dup(comm, &mpi_comm_));
  MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MPI_CHECK(MPI_Comm_size(comm, &size_));
  ncclUniqueId id;
  bootstrap_id(comm, &id, sizeof id,
               [](void* out) { NCCL_CHECK(ncclGetUniqueId(static_cast<ncclUniqueId*>(out))); });
  NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() {
  synchronize();
  ncclCommDestroy(comm_);
  MPI_Comm_free(&mpi_comm_);
  cudaFree(scratch_);
  if (host_staging_) cudaFree(host_staging_);
  cudaEventDestroy(done_);
  cudaEventDestroy(ready_);
  cudaStreamDestroy(stream_);
}

template <class Call>
void NcclCommunicator::enqueue(const char* op, std::size_t n, const char* type, Call&& call, bool join) {
  last_op_ = std::string(op) + " of " + std::to_string(n) + " " + type;
  CUDA_CHECK(cudaEventRecord(ready_, compute_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  NCCL_CHECK(call());
  CUDA_CHECK(cudaEventRecord(done_, stream_));
  done_in_capture_ = capturing(stream_);
  if (join) CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
}

void NcclCommunicator::allreduce_sum_detached(float* data, std::size_t n) {
  enqueue(
      "all_reduce (bucket)", n, "floats",
      [&] { return ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_); }, /*join=*/false);
}

// done_ was recorded after the last collective queued, and the NCCL stream runs
// them in order.
void NcclCommunicator::join() {
  // A graph's collectives are joined inside the graph, which replays on the compute stream.
  if (done_in_capture_ && !capturing(compute_)) return;
  CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
}

void NcclCommunicator::allreduce_sum_host(double* data, std::size_t n) {
  if (n == 0 || size_ == 1) return;
  if (n > host_staging_count_) {
    synchronize();  // the old copy's last use is done
    if (host_staging_) CUDA_CHECK(cudaFree(host_staging_));
    CUDA_CHECK(cudaMalloc(&host_staging_, n * sizeof(double)));
    host_staging_count_ = n;
  }
  last_op_ = "all_reduce of " + std::to_string(n) + " host doubles";
  CUDA_CHECK(cudaMemcpyAsync(host_staging_, data, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllReduce(host_staging_, host_staging_, n, ncclFloat64, ncclSum, comm_, stream_));
  CUDA_CHECK(cudaMemcpyAsync(data, host_staging_, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaEventRecord(done_, stream_));
  done_in_capture_ = false;  // a host copy is never captured
  synchronize();
}

namespace {
// On the timeline (io.trace) a bucket's all-reduce runs from its start on the NCCL
// stream's queue to the moment the host sees its event complete: at a later
// mark_ready (each trained layer; the layers' spans wait for their kernels then) or
// in finish(), which waits for the stream when the timeline records.
class NcclBucketReducer final : public BucketReducer {
 public:
  NcclBucketReducer(NcclCommunicator& comm, float* grads, std::vector<Bucket> buckets,
                    std::vector<std::int64_t> scatter_to)
      : comm_(comm),
        grads_(grads),
        buckets_(std::move(buckets)),
        scatter_to_(std::move(scatter_to)),
        trace_begin_(buckets_.size(), -1) {}
  ~NcclBucketReducer() override {
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
  }
  void mark_ready(std::int64_t offset) override {
    while (started_ < buckets_.size() && buckets_[started_].begin >= offset) start(started_++);
    for (std::size_t b = 0; b < started_; ++b) {
      if (trace_begin_[b] < 0) continue;
      const cudaError_t state = cudaEventQuery(done_[b]);
      if (state == cudaErrorNotReady) continue;
      CUDA_CHECK(state);
      trace_bucket(b, trace::now_ns());
    }
  }
  void finish() override {
    while (started_ < buckets_.size()) start(started_++);
    started_ = 0;
    comm_.join();
    if (std::none_of(trace_begin_.begin(), trace_begin_.end(), [](std::int64_t t) { return t >= 0; })) return;
    comm_.synchronize();  // under the communicator's watchdog
    const std::int64_t t = trace::now_ns();
    for (std::size_t b = 0; b < buckets_.size(); ++b) trace_bucket(b, t);
  }
  const std::vector<Bucket>& buckets() const override { return buckets_; }
  std::string method() const override {
    return scatter_to_.empty() ? "NCCL during backward, on its own stream"
                               : "NCCL reduce to the shares' owners during backward, on its own stream";
  }

 private:
  void start(std::size_t b) {
    const Bucket& k = buckets_[b];
    const bool traced = trace::recording();
    if (traced) trace_begin_[b] = trace::now_ns();
    if (scatter_to_.empty())
      comm_.allreduce_sum_detached(grads_ + k.begin, std::size_t(k.end - k.begin));
    else
      comm_.reduce_to_shares_detached(grads_, k.begin, k.end, scatter_to_);
    if (!traced) return;
    if (done_.empty()) {
      done_.resize(buckets_.size());
      for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(done_[b], comm_.stream()));
  }
  void trace_bucket(std::size_t b, std::int64_t end_ns) {
    if (trace_begin_[b] < 0) return;
    trace::record_bucket(b, (buckets_[b].end - buckets_[b].begin) * 4, trace_begin_[b], end_ns);
    trace_begin_[b] = -1;
  }

  NcclCommunicator& comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  std::vector<std::int64_t> scatter_to_;  // ZeRO share bounds; empty: all-reduce
  std::size_t started_ = 0;
  std::vector<std::int64_t> trace_begin_;  // per bucket: its all-reduce's start on the timeline; -1: none
  std::vector<cudaEvent_t> done_;          // per bucket, made at the first traced step
};
}  // namespace

std::unique_ptr<BucketReducer> NcclCommunicator::make_bucket_reducer(float* grads,
                                                                     std::vector<Bucket> buckets,
                                                                     const std::string& /*overlap*/,
                                                                     bool /*shared_memory*/,
                                                                     const std::vector<std::int64_t>& scatter_to) {
  return std::make_unique<NcclBucketReducer>(*this, grads, std::move(buckets), scatter_to);
}

void NcclCommunicator::reduce_to_shares_detached(float* data, std::int64_t begin, std::int64_t end,
                                                 const std::vector<std::int64_t>& bounds) {
  enqueue(
      "reduce to the shares (bucket)", std::size_t(end - begin), "floats",
      [&] {
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r + 1 < int(bounds.size()); ++r) {
          const std::int64_t lo = std::clamp(bounds[std::size_t(r)], begin, end);
          const std::int64_t hi = std::clamp(bounds[std::size_t(r) + 1], begin, end);
          if (hi > lo)
            NCCL_CHECK(ncclReduce(data + lo, data + lo, std::size_t(hi - lo), ncclFloat32, ncclSum, r, comm_, stream_));
        }
        return ncclGroupEnd();
      },
      /*join=*/false);
}

void NcclCommunicator::reduce_scatter_shares(float* data, const std::vector<std::int64_t>& bounds) {
  reduce_to_shares_detached(data, 0, bounds.back(), bounds);
  join();
}

void NcclCommunicator::allgather_shares(float* data, const std::vector<std::int64_t>& bounds) {
  enqueue("broadcast of the shares", std::size_t(bounds.back()), "floats", [&] {
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r + 1 < int(bounds.size()); ++r) {
      const std::int64_t lo = bounds[std::size_t(r)], hi = bounds[std::size_t(r) + 1];
      if (hi > lo) NCCL_CHECK(ncclBroadcast(data + lo, data + lo, std::size_t(hi - lo), ncclFloat32, r, comm_, stream_));
    }
    return ncclGroupEnd();
  });
}

void NcclCommunicator::allreduce_sum(float* data, std::size_t n) {
  enqueue("all_reduce", n, "floats",
          [&] { return ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_); });
}

void NcclCommunicator::allreduce_sum(double* data, std::size_t n) {
  enqueue("all_reduce", n, "doubles",
          [&] { return ncclAllReduce(data, data, n, ncclFloat64, ncclSum, comm_, stream_); });
}

void NcclCommunicator::broadcast(float* data, std::size_t n, int root) {
  enqueue("broadcast", n, "floats",
          [&] { return ncclBroadcast(data, data, n, ncclFloat32, root, comm_, stream_); });
}

void NcclCommunicator::reduce_scatter_sum(const float* send, float* recv, std::size_t recv_count) {
  enqueue("reduce_scatter", recv_count, "floats per rank",
          [&] { return ncclReduceScatter(send, recv, recv_count, ncclFloat32, ncclSum, comm_, stream_); });
}

void NcclCommunicator::all_gather(const float* send, float* recv, std::size_t send_count) {
  enqueue("all_gather", send_count, "floats per rank",
          [&] { return ncclAllGather(send, recv, send_count, ncclFloat32, comm_, stream_); });
}

void NcclCommunicator::barrier() {
  enqueue("barrier", 1, "float",
          [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  synchronize();
}

void NcclCommunicator::synchronize() {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(options_.timeout_s);
  // done_ was recorded after the last collective: polling it, not blocking in
  // cudaEventSynchronize, lets a dead peer or a network error be seen and reported.
  // Recorded inside a captured graph, it cannot be polled: the graph's replays run on
  // the compute stream, NCCL's branch joined, so an event recorded there now follows
  // the last collective replayed (seen on an H100: cudaErrorInvalidValue from the
  // query at the end of a 1-rank run with train.cuda_graph = 'on').
  if (done_in_capture_) {
    CUDA_CHECK(cudaEventRecord(done_, compute_));
    done_in_capture_ = false;
  }
  for (;;) {
    cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(comm_);
      DDP_FATAL("NCCL " << last_op_ << " failed on rank " << rank_ << " of " << size_ << ": "
                        << ncclGetErrorString(async) << "; communicator aborted");
    }
    if (clock::now() > deadline) {
      ncclCommAbort(comm_);
      DDP_FATAL("NCCL " << last_op_ << " did not complete within " << options_.timeout_s << " s on rank "
                        << rank_ << " of " << size_
                        << " (a rank died, hung or never called it); communicator aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace ddp::cuda
