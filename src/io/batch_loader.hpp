#pragma once
// Batches of samples from a ShardDataset, in the order of a sampler's indices,
// optionally read ahead by a prefetch thread so reading overlaps compute.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "io/shard_dataset.hpp"

namespace ddp {

struct Batch {
  std::int64_t size = 0;
  std::vector<std::int64_t> index;    // (B) global sample indices
  std::vector<float> x;               // (B, sample...) unless x_uint8 holds the batch
  std::vector<std::uint8_t> x_uint8;  // (B, stored...) uint8 as stored, from a loader that keeps uint8
  std::vector<std::int32_t> labels;   // (B) when the data has class labels
  std::vector<float> targets;         // (B, target...) otherwise
};

class BatchLoader {
 public:
  // Iterates over `indices` in order, batch_size at a time (the last batch may be
  // smaller). prefetch_depth 0: next() reads; > 0: a thread reads up to that many
  // batches ahead. `ds` must outlive the loader. keep_uint8: uint8 data goes into
  // Batch::x_uint8 as stored (a quarter of the bytes, converted on the rank), not x.
  // reuse: batches of an earlier loader (a past epoch's), whose buffers the
  // prefetch thread reads into before it makes new ones (a new buffer is allocated
  // and touched: at ImageNet size tens of milliseconds before an epoch's first
  // batch); the loader takes them and gives them back, with every batch it still
  // holds, when it is destroyed. It must outlive the loader.
  BatchLoader(ShardDataset& ds, std::vector<std::int64_t> indices, std::int64_t batch_size,
              int prefetch_depth, bool keep_uint8 = false, std::vector<Batch>* reuse = nullptr);
  ~BatchLoader();  // stops the thread, even mid-epoch
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch into `out` (its buffers are reused); false after the last one.
  // Rethrows an error the prefetch thread met while reading.
  bool next(Batch& out);
  std::int64_t num_batches() const { return num_batches_; }
  double wait_seconds() const { return wait_seconds_; }  // time next() spent blocked on data

 private:
  void load(std::int64_t b, Batch& out);  // reads batch b
  void run();                             // the prefetch thread

  ShardDataset& ds_;
  std::vector<std::int64_t> indices_;
  std::int64_t batch_size_;
  std::int64_t num_batches_;
  int depth_;
  bool keep_uint8_;
  std::vector<Batch>* reuse_;    // where the batches go back at the end; may be null
  std::int64_t next_batch_ = 0;  // next batch next() hands out
  double wait_seconds_ = 0.0;

  // Prefetch state, guarded by mu_.
  std::mutex mu_;
  std::condition_variable have_batch_, have_room_;
  std::deque<Batch> ready_;
  std::vector<Batch> spare_;  // handed-back buffers, reused to avoid reallocation
  bool stop_ = false;
  bool done_ = false;  // the thread has produced every batch or failed
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ddp
