#include "io/batch_loader.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "comm/fault_injection.hpp"

namespace ddp {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

BatchLoader::BatchLoader(ShardDataset& ds, std::vector<std::int64_t> indices, std::int64_t batch_size,
                         int prefetch_depth, bool keep_uint8, std::vector<Batch>* reuse)
    : ds_(ds),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      depth_(prefetch_depth),
      keep_uint8_(keep_uint8 && ds.x_is_uint8()),
      reuse_(reuse) {
  if (batch_size_ < 1) throw std::invalid_argument("BatchLoader: batch_size must be >= 1");
  if (depth_ < 0) throw std::invalid_argument("BatchLoader: prefetch_depth must be >= 0");
  const auto n = static_cast<std::int64_t>(indices_.size());
  num_batches_ = (n + batch_size_ - 1) / batch_size_;
  if (reuse_) spare_ = std::exchange(*reuse_, {});
  if (depth_ > 0) thread_ = std::thread(&BatchLoader::run, this);
}

BatchLoader::~BatchLoader() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    have_room_.notify_all();
    thread_.join();  // the thread finishes at most the one read it is in
  }
  if (!reuse_) return;
  // A caller's first, empty batch may be among the spares, never read into.
  for (Batch& b : spare_)
    if (b.size > 0) reuse_->push_back(std::move(b));
  for (Batch& b : ready_) reuse_->push_back(std::move(b));
}

void BatchLoader::load(std::int64_t b, Batch& out) {
  const std::int64_t begin = b * batch_size_;
  const auto total = static_cast<std::int64_t>(indices_.size());
  const std::int64_t size = std::min(batch_size_, total - begin);
  const auto n = static_cast<std::size_t>(size);
  out.size = size;
  out.index.assign(indices_.begin() + begin, indices_.begin() + begin + size);
  const auto numel = static_cast<std::size_t>(ds_.sample_numel());
  out.x.resize(keep_uint8_ ? 0 : n * numel);
  out.x_uint8.resize(keep_uint8_ ? n * numel : 0);
  const bool labels = ds_.has_class_labels();
  const auto tnumel = static_cast<std::size_t>(ds_.target_numel());  // a sample's labels (T for tokens) or targets
  out.labels.resize(labels ? n * tnumel : 0);
  out.targets.resize(labels ? 0 : n * tnumel);
  std::int32_t* l = labels ? out.labels.data() : nullptr;
  float* t = labels ? nullptr : out.targets.data();
  if (keep_uint8_)
    ds_.read_stored(out.index.data(), size, out.x_uint8.data(), l, t);
  else
    ds_.read(out.index.data(), size, out.x.data(), l, t);
}

void BatchLoader::run() {
  try {
    for (std::int64_t b = 0; b < num_batches_; ++b) {
      Batch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        have_room_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < depth_; });
        if (stop_) return;
        if (!spare_.empty()) {
          batch = std::move(spare_.back());
          spare_.pop_back();
        }
      }
      inject_fault(FaultSite::prefetch, b);  // tests only: DDP_INJECT_FAULT
      load(b, batch);  // outside the lock: next() may hand out earlier batches meanwhile
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(batch));
      }
      have_batch_.notify_one();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  have_batch_.notify_one();
}

bool BatchLoader::next(Batch& out) {
  if (next_batch_ >= num_batches_) return false;
  const auto t0 = std::chrono::steady_clock::now();
  if (depth_ == 0) {
    load(next_batch_, out);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    have_batch_.wait(lock, [&] { return !ready_.empty() || done_; });
    if (ready_.empty()) {
      // done_ with nothing left before batch next_batch_: the thread failed.
      if (error_) std::rethrow_exception(error_);
      throw std::logic_error("BatchLoader: prefetch thread ended early");
    }
    spare_.push_back(std::move(out));
    out = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    have_room_.notify_one();
  }
  wait_seconds_ += seconds_since(t0);
  ++next_batch_;
  return true;
}

}  // namespace ddp
