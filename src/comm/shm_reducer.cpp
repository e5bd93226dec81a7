#include "comm/shm_reducer.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"

namespace ddp {

namespace {

constexpr std::int64_t kPage = 4096;
constexpr std::int64_t kBlock = 1024;  // floats summed at a time: 4 KB, in L1 while every rank's add in

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

char* page_aligned(char* p) {
  return p + (kPage - std::int64_t(reinterpret_cast<std::uintptr_t>(p) % kPage)) % kPage;
}

}  // namespace

std::unique_ptr<ShmReducer> ShmReducer::make(MPI_Comm comm, float* grads, std::vector<Bucket> buckets,
                                             const std::vector<std::int64_t>& scatter_to) {
  int rank = 0, size = 1, local = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  // Every rank finds its node to hold all ranks, or every rank finds it to hold fewer.
  if (local != size || buckets.empty()) return nullptr;
  std::unique_ptr<ShmReducer> r(new ShmReducer(comm, grads, std::move(buckets), scatter_to));
  if (r->win_ == MPI_WIN_NULL) return nullptr;  // the constructor said why
  return r;
}

ShmReducer::ShmReducer(MPI_Comm comm, float* grads, std::vector<Bucket> buckets,
                       const std::vector<std::int64_t>& scatter_to)
    : grads_(grads),
      buckets_(std::move(buckets)),
      scatter_(!scatter_to.empty()),
      block_(std::size_t(kBlock)) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // The buckets tile [0, n_) (plan_buckets packs every tensor from the end down).
  std::int64_t covered = 0;
  for (const Bucket& b : buckets_) {
    n_ = std::max(n_, b.end);
    covered += b.end - b.begin;
  }
  if (covered != n_)
    DDP_FATAL("shared-memory all-reduce: the buckets cover " << covered << " of " << n_ << " floats");
  // Shares of whole 64-byte lines, so that no two ranks write one line; ZeRO's own
  // (4 KB-aligned) when each rank keeps the sums of its share only.
  share_.resize(std::size_t(size_) + 1);
  for (int r = 0; r <= size_; ++r) share_[std::size_t(r)] = std::min(n_, round_up(n_ * r / size_, 16));
  if (scatter_) {
    if (scatter_to.size() != share_.size() || scatter_to.back() != n_)
      DDP_FATAL("shared-memory reduce-scatter: " << scatter_to.size() - 1 << " shares of "
                                                 << scatter_to.back() << " floats for " << size_
                                                 << " ranks and " << n_ << " floats");
    share_ = scatter_to;
  }

  // This rank's segment: its control line, then its gradients at the page offset of
  // the buffer they replace (make_buffer chose it apart from the parameters' and the
  // activations': no 4K aliasing between them in the optimizer).
  const std::int64_t slot_at =
      kPage + std::int64_t(reinterpret_cast<std::uintptr_t>(grads) % kPage) / 64 * 64;
  MPI_Info info;
  MPI_CHECK(MPI_Info_create(&info));
  MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));  // each segment in its rank's memory
  char* base = nullptr;
  // Where MPI has no shared-memory window (its osc component chosen away, as the
  // watchdog's tests do to stand for TCP across nodes), the run reduces through MPI.
  const int rc = MPI_Win_allocate_shared(MPI_Aint(kPage + slot_at + n_ * 4), 1, info, comm_, &base, &win_);
  MPI_CHECK(MPI_Info_free(&info));
  int ok = rc == MPI_SUCCESS, all_ok = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_));
  if (!all_ok) {
    // A window that some ranks made is left, not freed: freeing is collective.
    win_ = MPI_WIN_NULL;
    if (rank_ == 0)
      log::info("gradients: no shared-memory window (" +
                (rc == MPI_SUCCESS ? std::string("another rank's MPI_Win_allocate_shared failed")
                                   : mpi_error_string(rc)) +
                "): summed by MPI");
    return;
  }
  MPI_CHECK(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  // Offsets from the segment's first page boundary: a page boundary in every
  // process's mapping of it, whatever alignment MPI gave the segment.
  base = page_aligned(base);
  new (base) Control{{0}, {0}, slot_at};
  MPI_CHECK(MPI_Barrier(comm_));  // every control line is made before any rank reads one
  for (int r = 0; r < size_; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    char* at = nullptr;
    MPI_CHECK(MPI_Win_shared_query(win_, r, &size, &unit, &at));
    at = page_aligned(at);
    Control* c = reinterpret_cast<Control*>(at);
    control_.push_back(c);
    slot_.push_back(reinterpret_cast<float*>(at + c->slot_at));
  }
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
}

ShmReducer::~ShmReducer() {
  if (win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }
  MPI_Comm_free(&comm_);
}

std::string ShmReducer::method() const {
  return std::string(scatter_ ? "each rank's share " : "") +
         "summed in a shared-memory window after backward (" + std::to_string(size_) +
         " ranks on one node; comm.shared_memory)";
}

float* ShmReducer::take_gradients() {
  float* slot = slot_[std::size_t(rank_)];
  if (grads_ != slot) std::memcpy(slot, grads_, std::size_t(n_) * sizeof(float));
  grads_ = slot;
  return slot;
}

void ShmReducer::mark_ready(std::int64_t offset) {
  float* slot = slot_[std::size_t(rank_)];
  if (grads_ == slot) return;  // taken: backward wrote them there
  for (; copied_ < buckets_.size() && buckets_[copied_].begin >= offset; ++copied_) {
    const Bucket& b = buckets_[copied_];
    std::memcpy(slot + b.begin, grads_ + b.begin, std::size_t(b.end - b.begin) * sizeof(float));
  }
}

// A balanced step's wait is microseconds: spun, then yielding the core. A longer one
// (a peer writing a checkpoint, a straggler, a stopped rank the watchdog will name,
// or, in a test suite, a peer waiting for a core) sleeps between loads past its
// first 10 ms and gives the core back (poll_until).
void ShmReducer::barrier() {
  ++barriers_;
  control_[std::size_t(rank_)]->arrived.store(barriers_, std::memory_order_release);
  for (const Control* c : control_)
    poll_until([&] { return c->arrived.load(std::memory_order_acquire) >= barriers_; });
}

void ShmReducer::finish() {
  watchdog::Collective guard("the gradient all-reduce");
  mark_ready(0);
  copied_ = 0;
  const std::int64_t t0 = trace::recording() ? trace::now_ns() : -1;
  barrier();  // every rank's gradients are final

  // This rank's share, in place in its own gradients (no other rank reads them there
  // before the next barrier): each block summed over the ranks in rank order, in L1.
  const std::int64_t lo = share_[std::size_t(rank_)], hi = share_[std::size_t(rank_) + 1];
  float* acc = block_.data();
  float* out = slot_[std::size_t(rank_)];
  std::int64_t bad = 0;
  for (std::int64_t b = lo; b < hi; b += kBlock) {
    const std::int64_t len = std::min(kBlock, hi - b);
    const float* s0 = slot_[0] + b;
    for (std::int64_t i = 0; i < len; ++i) acc[i] = s0[i];
    for (std::size_t r = 1; r < slot_.size(); ++r) {
      const float* s = slot_[r] + b;
      for (std::int64_t i = 0; i < len; ++i) acc[i] += s[i];
    }
    // x - x is 0 for a finite x, NaN for inf and NaN; an int count, so the loop vectorises.
    int block_bad = 0;
    float* o = out + b;
    for (std::int64_t i = 0; i < len; ++i) {
      o[i] = acc[i];
      block_bad += !(acc[i] - acc[i] == 0.0f);
    }
    bad += block_bad;
  }
  control_[std::size_t(rank_)]->nonfinite.store(bad, std::memory_order_relaxed);
  barrier();  // every share is summed (its count published before, by the barrier's release)

  nonfinite_ = 0;
  for (int r = 0; r < size_; ++r)
    nonfinite_ += control_[std::size_t(r)]->nonfinite.load(std::memory_order_relaxed);
  if (scatter_) {
    // ZeRO stage 2: the share's sums are all this rank keeps. No rank reads another's
    // gradients after the barrier above, so each may write its own again.
    if (grads_ != out) std::memcpy(grads_ + lo, out + lo, std::size_t(hi - lo) * sizeof(float));
    if (t0 >= 0 && trace::recording()) {
      const std::int64_t t1 = trace::now_ns();
      for (std::size_t b = 0; b < buckets_.size(); ++b)
        trace::record_bucket(b, (buckets_[b].end - buckets_[b].begin) * 4, t0, t1);
    }
    return;
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::int64_t begin = share_[std::size_t(r)], end = share_[std::size_t(r) + 1];
    std::memcpy(out + begin, slot_[std::size_t(r)] + begin, std::size_t(end - begin) * sizeof(float));
  }
  barrier();  // every rank has its copies: from here each writes its gradients again
  if (grads_ != out) std::memcpy(grads_, out, std::size_t(n_) * sizeof(float));
  if (t0 >= 0 && trace::recording()) {
    const std::int64_t t1 = trace::now_ns();
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      trace::record_bucket(b, (buckets_[b].end - buckets_[b].begin) * 4, t0, t1);
  }
}

bool ShmReducer::allgather_shares(float* params, const std::vector<std::int64_t>& bounds) {
  if (bounds.size() != std::size_t(size_) + 1 || bounds.back() > n_) return false;
  watchdog::Collective guard("the all-gather of the parameter shares (shared memory)");
  float* own = slot_[std::size_t(rank_)];
  const std::int64_t lo = bounds[std::size_t(rank_)], hi = bounds[std::size_t(rank_) + 1];
  std::memcpy(own + lo, params + lo, std::size_t(hi - lo) * sizeof(float));
  barrier();  // every share is in its owner's slot
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::int64_t begin = bounds[std::size_t(r)], end = bounds[std::size_t(r) + 1];
    std::memcpy(params + begin, slot_[std::size_t(r)] + begin, std::size_t(end - begin) * sizeof(float));
  }
  barrier();  // every rank has its copies: backward may write the slots again
  return true;
}

}  // namespace ddp
