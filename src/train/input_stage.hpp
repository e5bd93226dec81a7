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
//
// A uint8 batch (Batch::x_uint8, images as stored) stays uint8 up to the compute
// space: put() draws its samples' boxes on the host, and the ImageTransform's one
// kernel makes the model's floats there (on the host in put(), on a device in take(),
// after the copy, so only uint8 crosses PCIe).

#include <cstdint>
#include <memory>

#include "io/batch_loader.hpp"
#include "model/tensor.hpp"
#include "train/augment.hpp"

namespace ddp {

namespace cuda {
class BatchCopies;
}

struct Inputs {
  View1 x;           // (B * sample_numel)
  LabelView labels;  // (B * target_numel) class labels (integer /y: target_numel 1) or next tokens
  View1 targets;     // (B * target_numel) float targets otherwise
};

// How a uint8 batch becomes floats: the transform, the stored images' shape, and which
// samples' draws (the epoch; training or the centre crop of evaluation).
struct BatchTransform {
  const ImageTransform* transform = nullptr;
  ImageShape in;
  std::int64_t epoch = 0;
  bool training = false;
};

class InputStage {
 public:
  // Slots for batches of up to `batch_size` samples of `sample_numel` floats (the
  // model's input); stored_numel > 0: also uint8 batches of up to that many bytes per
  // sample.
  InputStage(std::int64_t batch_size, std::int64_t sample_numel, bool class_labels, std::int64_t target_numel,
             std::int64_t stored_numel = 0);
  ~InputStage();

  // Slots alternate: at most one put ahead of the step that runs. A batch in
  // Batch::x_uint8 needs `t`, whose transform outlives the slot's take().
  int put(const Batch& batch, const BatchTransform* t = nullptr);
  Inputs take(int slot);
  void release(int slot);

 private:
  static constexpr int kSlots = 2;
  std::int64_t sample_numel_, target_numel_, stored_numel_;
  bool class_labels_;
  Inputs slots_[kSlots];
  // uint8 batches: the boxes drawn on the host, (B) per slot; in the GPU build also
  // the batch and the boxes in device memory, and what take() converts.
  std::vector<SampleBox> boxes_host_[kSlots];
  Kokkos::View<std::uint8_t*> x_uint8_[kSlots];  // (B * stored_numel)
  Kokkos::View<std::int32_t*> boxes_[kSlots];    // (B * 5): SampleBox's fields
  BatchTransform pending_[kSlots];               // transform == nullptr: nothing to convert
  std::int64_t pending_size_[kSlots] = {};
  int next_ = 0;
  std::unique_ptr<cuda::BatchCopies> copies_;  // GPU build: the pinned side-stream copies
};

}  // namespace ddp
