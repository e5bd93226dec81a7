#pragma once
// The gradient all-reduce through a node's shared memory, for runs whose ranks all
// share one node and whose gradients are in host memory (comm.shared_memory).
//
// MPI_Allreduce makes the sums out of sight, so the trainer passed over them once
// more to count inf and NaN (0.12 ms of the MLP's 3.4 ms 2-rank step on the AVX2
// EPYC). Here the count comes with the sums. Each rank's gradients live in its
// segment of one MPI shared window (take_gradients: the model's gradient buffer
// moves there), and finish() is
//  - a barrier: every rank's gradients are final;
//  - each rank sums its 1/N of the buffer over the N ranks' gradients, rank 0 first,
//    counting the sums that are not finite, and writes them over its own gradients
//    there (no other rank reads that share of them);
//  - a barrier: every share is summed;
//  - each rank copies the other ranks' shares of sums from their gradients;
//  - a barrier: every copy is made, so each rank may write its gradients again.
// Every sum is made once, in one order, so every rank holds the same bits, as with
// MPI.
//
// The sums themselves take about as long as MPI_Allreduce's: both move the same
// bytes between the cores (MLP, 2 ranks, io.trace: all-reduce wait 0.42-0.49 ms
// against 0.40-0.73 with MPI; step checks 0.03-0.04 against 0.12).
//
// The barriers spin on counters in the window, then yield the core (tests run more
// ranks than cores), and past 10 ms of waiting sleep (poll_until).
// Loads and stores are ordered by acquire/release atomics, inside
// a passive-target epoch (MPI_Win_lock_all) kept open for the window's life.

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"

namespace ddp {

class ShmReducer final : public BucketReducer {
 public:
  // Collective over `comm`. Null when its ranks do not all share a node (the caller
  // then reduces through MPI). grads: the buckets' span of host memory, [0, n).
  // scatter_to: empty, or ZeRO's share bounds (comm.zero = 2): each rank sums its
  // share and keeps those sums only (no copies of the others', one barrier less).
  static std::unique_ptr<ShmReducer> make(MPI_Comm comm, float* grads, std::vector<Bucket> buckets,
                                          const std::vector<std::int64_t>& scatter_to = {});
  ~ShmReducer() override;  // collective: frees the window
  ShmReducer(const ShmReducer&) = delete;
  ShmReducer& operator=(const ShmReducer&) = delete;

  // Until take_gradients(), each bucket is copied into this rank's segment when
  // backward has made it; after it, the gradients are there already.
  void mark_ready(std::int64_t offset) override;
  void finish() override;
  const std::vector<Bucket>& buckets() const override { return buckets_; }
  std::int64_t nonfinite_sums() const override { return nonfinite_; }
  float* take_gradients() override;
  // Through the window: each rank writes its updated share into its gradients' slot
  // (spent after the step), and after a barrier copies the others' from theirs; a
  // second barrier before any backward writes its slot again. Host memory.
  bool allgather_shares(float* params, const std::vector<std::int64_t>& bounds) override;
  std::string method() const override;

 private:
  struct alignas(128) Control {           // the first line of a rank's segment
    std::atomic<std::uint64_t> arrived;   // barriers this rank has reached
    std::atomic<std::int64_t> nonfinite;  // non-finite sums of its share, at the last finish()
    std::int64_t slot_at;                 // byte offset of its gradients in its segment
  };
  ShmReducer(MPI_Comm comm, float* grads, std::vector<Bucket> buckets,
             const std::vector<std::int64_t>& scatter_to);
  void barrier();  // every rank has reached as many barriers as this one

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  float* grads_;  // the gradients this rank reduces: the caller's, or slot_[rank_] once taken
  std::vector<Bucket> buckets_;
  bool scatter_ = false;  // ZeRO stage 2: keep the sums of this rank's share only
  int rank_ = 0, size_ = 1;
  std::int64_t n_ = 0;               // floats in the buffer: [0, n_)
  std::vector<std::int64_t> share_;  // rank r sums [share_[r], share_[r + 1])
  std::vector<Control*> control_;    // per rank, in its segment
  std::vector<float*> slot_;         // per rank: its gradients, n_ floats
  std::size_t copied_ = 0;           // buckets [0, copied_) are in this rank's slot this step
  std::uint64_t barriers_ = 0;
  std::int64_t nonfinite_ = 0;
  std::vector<float> block_;  // a block of sums in the making (L1)
};

}  // namespace ddp
