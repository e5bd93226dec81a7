#pragma once
// Bucketed, overlapped gradient all-reduce, as DistributedDataParallel does it.
//
// The gradient buffer is cut into buckets: contiguous ranges of whole parameter
// tensors, taken in reverse order (backward produces the last layer's gradients
// first), a small first bucket so communication starts early, then buckets of
// about bucket_mb. When backward has finished every gradient at or above an
// offset, mark_ready(offset) starts the all-reduce of every bucket that lies
// entirely above it; finish() waits for what is still in flight.
//
// Non-blocking collectives in MPI progress only inside MPI calls. Two ways to
// give them that, chosen at construction and measured by tools/ddp_bench:
//  - Progress::Poll: MPI_Iallreduce at start, MPI_Testall at every mark_ready/poll;
//    the last bucket, which backward completes last, by MPI_Allreduce in finish();
//  - Progress::Thread: a communication thread runs blocking MPI_Allreduce calls on
//    the buckets in order (needs MPI_THREAD_MULTIPLE), on its own communicator.

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp {

struct Bucket {
  std::int64_t begin = 0, end = 0;  // [begin, end) in the gradient buffer
};

// Buckets over tensors given by their [offset, offset+size) ranges in increasing
// order, packed from the END of the buffer. first_bucket_mb caps the first,
// bucket_mb the others; a tensor larger than the cap is a bucket of its own.
std::vector<Bucket> plan_buckets(const std::vector<std::pair<std::int64_t, std::int64_t>>& tensors,
                                 double bucket_mb, double first_bucket_mb);

// ZeRO (comm/shares.hpp): how much of the range [begin, end) of the flat buffer each
// rank's share holds, as MPI counts, and where (displacements from begin). Every
// count must fit an int.
struct ShareCounts {
  std::vector<int> counts, displs;
};
ShareCounts share_counts(const std::vector<std::int64_t>& bounds, std::int64_t begin, std::int64_t end);

// The sums of data[begin, end) over the ranks of `comm`, this rank's share of them
// only, in place: MPI_Reduce_scatter leaves them at data + begin, and
// place_scattered moves them to their own offsets. `counts`: share_counts(bounds,
// begin, end).counts. With a request, MPI_Ireduce_scatter is started (counts must
// outlive it) and place_scattered is the caller's to call once it completes;
// without, it is blocking and placed on return.
void reduce_scatter_range(MPI_Comm comm, int rank, float* data, std::int64_t begin, std::int64_t end,
                          const std::vector<std::int64_t>& bounds, MPI_Request* request,
                          const std::vector<int>* counts = nullptr);
void place_scattered(float* data, int rank, std::int64_t begin, std::int64_t end,
                     const std::vector<std::int64_t>& bounds);

// What the trainer sees of a bucketed all-reduce, whichever communicator runs it
// (Communicator::make_bucket_reducer): MPI on host buffers (GradientReducer below),
// a node's shared memory (comm/shm_reducer.hpp) or NCCL on device buffers
// (src/cuda/nccl_communicator.cpp).
class BucketReducer {
 public:
  virtual ~BucketReducer() = default;
  // Every gradient at offsets >= `offset` is final for this step: start the
  // buckets that lie entirely at or above it (in bucket order).
  virtual void mark_ready(std::int64_t offset) = 0;
  // Start what is left; when it returns, the work queued after it (the optimizer)
  // sees the sums: on the host it has waited for them, on a GPU the compute stream
  // waits for them.
  virtual void finish() = 0;
  virtual const std::vector<Bucket>& buckets() const = 0;
  // The inf and NaN among the sums of the last finish(), where the reducer counts
  // them as it sums (the same count on every rank); -1 where it does not, and the
  // caller counts.
  virtual std::int64_t nonfinite_sums() const { return -1; }
  // A buffer of this reducer's own to take the gradients' place (the caller copies
  // nothing: the current values are in it), so that no bucket is copied at
  // mark_ready; it lives as long as the reducer. nullptr: the reducer works on the
  // buffer it was given, as most do.
  virtual float* take_gradients() { return nullptr; }
  // ZeRO: the all-gather of the parameter shares (Communicator::allgather_shares)
  // through this reducer's own means, after the optimizer step (the gradients are
  // spent then and may be written over until the next backward). False where it has
  // none: the caller asks the communicator.
  virtual bool allgather_shares(float* /*params*/, const std::vector<std::int64_t>& /*bounds*/) {
    return false;
  }
  // How the sums are made, for the log: "MPI during backward, progressed by polling".
  virtual std::string method() const = 0;
};

class GradientReducer final : public BucketReducer {
 public:
  enum class Progress { Poll, Thread };
  static Progress parse_progress(const std::string& name);  // "poll" | "thread"

  // grads: the gradient buffer (host memory); buckets from plan_buckets. scatter_to:
  // empty, or the ZeRO share bounds (comm.zero = 2): each bucket is reduce-scattered.
  GradientReducer(MPI_Comm comm, float* grads, std::vector<Bucket> buckets, Progress progress,
                  std::vector<std::int64_t> scatter_to = {});
  ~GradientReducer() override;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void mark_ready(std::int64_t offset) override;
  void poll();             // let in-flight non-blocking reductions progress (Poll mode)
  void finish() override;  // start what is left, wait for everything; the buffer holds the sums

  const std::vector<Bucket>& buckets() const override { return buckets_; }
  std::string method() const override {
    return std::string(scatter_to_.empty() ? "MPI" : "MPI reduce-scatter to the shares") +
           (progress_ == Progress::Poll ? " during backward, progressed by polling"
                                        : " during backward, by a communication thread");
  }
  double finish_wait_seconds() const { return finish_wait_; }  // last finish(): time blocked

 private:
  void start(std::size_t bucket);
  void reduce_blocking(std::size_t bucket);  // all-reduce or reduce-scatter, placed
  void run_thread();
  void traced_done(int count);  // completed_index_[0, count) just completed (MPI_UNDEFINED: none left)
  void trace_bucket(std::size_t bucket, std::int64_t end_ns);  // its span in the timeline (io.trace)

  MPI_Comm comm_ = MPI_COMM_NULL;
  float* grads_;
  std::vector<Bucket> buckets_;
  Progress progress_;
  int size_ = 1, rank_ = 0;
  std::vector<std::int64_t> scatter_to_;    // ZeRO share bounds; empty: all-reduce
  std::vector<std::vector<int>> counts_;    // per bucket, scatter_to_ only: share_counts
  std::size_t started_ = 0;  // buckets [0, started_) have been started this step
  std::vector<MPI_Request> requests_;
  std::vector<int> completed_index_;       // MPI_Testsome/Waitsome's output
  std::vector<std::int64_t> trace_begin_;  // per bucket: its all-reduce's start in the timeline; -1: none
  double finish_wait_ = 0.0;

  // Thread mode: the main thread queues bucket numbers, the thread reduces them.
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  std::size_t completed_ = 0;  // buckets finished this step
  bool stop_ = false;
};

}  // namespace ddp
