#pragma once
// The host edge of a step's inputs: the loader's batch (host memory) goes to the
// compute space here, into one of two slots, so that a batch can be on its way while
// the step before it still runs. On the host a put is a plain copy. In the GPU build
// it is a copy from pinned memory on a side stream (cuda/batch_copies.hpp) that
// overlaps the previous step's kernels, and a step waits for its own batch's copy
// on the device, not on the host.
//
//   int s = stage.put(batch);     // start moving the batch
//   Inputs in = stage.take(s);    // its views, ordered after the copy
//   ... forward/backward read in.x, in.labels, in.targets ...
//   stage.release(s);             // every kernel reading slot s is enqueued

#include <cstdint>
#include <memory>

#include "io/batch_loader.hpp"
#include "model/tensor.hpp"

namespace ddp {

namespace cuda {
class BatchCopies;
}

struct Inputs {
  View1 x;           // (B * sample_numel)
  LabelView labels;  // (B) class labels (data with integer /y)
  View1 targets;     // (B * target_numel) otherwise
};

class InputStage {
 public:
  // Slots for batches of up to `batch_size` samples.
  InputStage(std::int64_t batch_size, std::int64_t sample_numel, bool class_labels, std::int64_t target_numel);
  ~InputStage();

  int put(const Batch& batch);  // slots alternate: at most one put ahead of the step that runs
  Inputs take(int slot);
  void release(int slot);

 private:
  static constexpr int kSlots = 2;
  std::int64_t sample_numel_, target_numel_;
  bool class_labels_;
  Inputs slots_[kSlots];
  int next_ = 0;
  std::unique_ptr<cuda::BatchCopies> copies_;  // GPU build: the pinned side-stream copies
};

}  // namespace ddp
