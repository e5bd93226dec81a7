#include "cuda/nccl_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "comm/backend.hpp"
#include "comm/fault_injection.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"
#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

namespace {
void abort_hook(void* self) { static_cast<NcclCommunicator*>(self)->abort(); }
}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t compute, Options options)
    : compute_(compute), host_(make_mpi_communicator(comm)), options_(options) {
  MPI_CHECK(MPI_Comm_dup(comm, &mpi_comm_));
  MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MPI_CHECK(MPI_Comm_size(comm, &size_));
  {
    // A rank that never comes leaves the others inside ncclCommInitRank: named.
    const watchdog::Collective guard("the NCCL communicator's start (its id's MPI_Bcast, ncclCommInitRank)");
    ncclUniqueId id;
    bootstrap_id(comm, &id, sizeof id,
                 [](void* out) { NCCL_CHECK(ncclGetUniqueId(static_cast<ncclUniqueId*>(out))); });
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  }
  add_abort_hook(abort_hook, this);
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&host_wait_, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() {
  remove_abort_hook(abort_hook, this);  // waits for one under way
  if (!aborted_) {                      // aborted: freed already, and MPI_Abort is on its way
    synchronize();
    destroy();
  }
  MPI_Comm_free(&mpi_comm_);
  cudaFree(scratch_);
  cudaEventDestroy(host_wait_);
  cudaEventDestroy(done_);
  cudaEventDestroy(ready_);
  cudaStreamDestroy(stream_);
}

// ncclCommDestroy stops this rank's proxy thread, which waits for the ranks of its
// host (to NCCL) connected to it: a peer on the node that is alive but hung before
// its own destroy (one that died has closed its sockets) would leave this rank
// inside it until the job's time limit. The watchdog names such a rank; without one
// running, a thread of its own makes the call, waited for comm.timeout_s (1e9 s
// where comm.timeout_s = 0 turns the watchdog off: unbounded, as asked).
void NcclCommunicator::destroy() {
  inject_fault(FaultSite::communicator_end, 0);
  const watchdog::Collective guard("the NCCL communicator's end (ncclCommDestroy)");
  if (watchdog::running() || options_.timeout_s <= 0) {
    ncclCommDestroy(comm_);
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ended = done->get_future();
  std::thread call([comm = comm_, done] {
    ncclCommDestroy(comm);
    done->set_value();
  });
  if (ended.wait_for(std::chrono::duration<double>(options_.timeout_s)) == std::future_status::ready) {
    call.join();
    return;
  }
  call.detach();
  fatal_as("hang", "waited " + std::to_string(int(options_.timeout_s)) +
                       " s (comm.timeout_s) in the NCCL communicator's end (ncclCommDestroy) on rank " +
                       std::to_string(rank_) + " of " + std::to_string(size_) +
                       " (a rank of this node hung before its own; no watchdog to name it)");
}

// Only while the main thread waits in poll(): NCCL takes no two calls on one
// communicator at once, and elsewhere the main thread may be inside one (queuing a
// collective, launching a graph). There MPI_Abort ends the process, kernels and all.
void NcclCommunicator::abort() {
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_ || !in_poll_) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

template <class Call>
void NcclCommunicator::enqueue(const char* op, std::size_t n, const char* type, Call&& call, bool join) {
  last_op_ = std::string(op) + " of " + std::to_string(n) + " " + type;
  CUDA_CHECK(cudaEventRecord(ready_, compute_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  {
    // Queuing returns at once, except where NCCL first connects to its peers (a
    // communicator's first collective of a kind): a peer that never comes is named.
    const watchdog::Collective guard("the start of a NCCL collective (NCCL connecting to its peers)");
    NCCL_CHECK(call());
  }
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

void NcclCommunicator::allreduce_sum_host(double* data, std::size_t n) { host_->allreduce_sum_host(data, n); }
void NcclCommunicator::allreduce_sum_host_waiting(double* data, std::size_t n) {
  host_->allreduce_sum_host_waiting(data, n);
}

void NcclCommunicator::wait_device(const char* what) {
  CUDA_CHECK(cudaEventRecord(host_wait_, compute_));
  poll(host_wait_, what);
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

std::unique_ptr<BucketReducer> NcclCommunicator::make_bucket_reducer(
    float* grads, std::vector<Bucket> buckets, const std::string& /*overlap*/, bool /*shared_memory*/,
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
            NCCL_CHECK(ncclReduce(data + lo, data + lo, std::size_t(hi - lo), ncclFloat32, ncclSum, r, comm_,
                                  stream_));
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
      if (hi > lo)
        NCCL_CHECK(ncclBroadcast(data + lo, data + lo, std::size_t(hi - lo), ncclFloat32, r, comm_, stream_));
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
  // done_ was recorded after the last collective. Recorded inside a captured graph, it
  // cannot be polled: the graph's replays run on the compute stream, NCCL's branch
  // joined, so an event recorded there now follows the last collective replayed (seen
  // on an H100: cudaErrorInvalidValue from the query at the end of a 1-rank run with
  // train.cuda_graph = 'on').
  if (done_in_capture_) {
    CUDA_CHECK(cudaEventRecord(done_, compute_));
    done_in_capture_ = false;
  }
  poll(done_, "a wait for NCCL's collectives (cudaEventQuery)");
}

void NcclCommunicator::poll(cudaEvent_t event, const char* what) {
  using clock = std::chrono::steady_clock;
  // Polling, not blocking in cudaEventSynchronize, lets a dead peer or a network
  // error be seen and reported, and the watchdog see this rank waiting.
  const watchdog::Collective guard(what);
  struct InPoll {  // abort() may act while this lives
    NcclCommunicator& c;
    explicit InPoll(NcclCommunicator& comm) : c(comm) {
      const std::lock_guard<std::mutex> lock(c.abort_mutex_);
      c.in_poll_ = true;
    }
    ~InPoll() {
      const std::lock_guard<std::mutex> lock(c.abort_mutex_);
      c.in_poll_ = false;
    }
  } in_poll(*this);
  const bool own_deadline = !watchdog::running() && options_.timeout_s > 0;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration<double>(options_.timeout_s);
  for (;;) {
    ncclResult_t async = ncclSuccess, asked = ncclSuccess;
    cudaError_t state = cudaErrorNotReady;
    bool gone = false;
    {
      const std::lock_guard<std::mutex> lock(abort_mutex_);
      gone = aborted_;
      if (!gone) {
        state = cudaEventQuery(event);
        if (state == cudaErrorNotReady) asked = ncclCommGetAsyncError(comm_, &async);
      }
    }
    // Aborted by a fatal error on another thread (the watchdog's line): MPI_Abort is
    // on its way, and the communicator is gone.
    if (gone) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      continue;
    }
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    NCCL_CHECK(asked);
    // The line first; the fatal path's hook then aborts the communicator, within its
    // bound (an ncclCommAbort may block where a peer is gone).
    if (async != ncclSuccess && async != ncclInProgress) {
      DDP_FATAL("NCCL " << last_op_ << " failed on rank " << rank_ << " of " << size_ << ", waiting in "
                        << what << ": " << ncclGetErrorString(async) << "; communicator aborted");
    }
    if (own_deadline && clock::now() > deadline) {
      fatal_as("hang",
               "waited " + std::to_string(int(options_.timeout_s)) + " s (comm.timeout_s) in " + what +
                   " after NCCL " + last_op_ + " on rank " + std::to_string(rank_) + " of " +
                   std::to_string(size_) +
                   " (a rank died, hung or never called it; no watchdog to name it); communicator aborted");
    }
    // The step's wait is on the hot path (a step of the MLP takes about 0.1 ms on an
    // H100): spin for the first 2 ms, then sleep between looks.
    if (clock::now() - start < std::chrono::milliseconds(2))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace ddp::cuda
