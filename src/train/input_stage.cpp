#include "train/input_stage.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/batch_copies.hpp"
#else
namespace ddp::cuda {
// The host build copies in put() and has nothing to order: copies_ stays null.
class BatchCopies {
 public:
  void acquire(int) {}
  void release(int) {}
};
}  // namespace ddp::cuda
#endif

namespace ddp {

static_assert(sizeof(SampleBox) == 5 * sizeof(std::int32_t), "SampleBox travels as 5 int32");

InputStage::InputStage(std::int64_t batch_size, std::int64_t sample_numel, bool class_labels,
                       std::int64_t target_numel, std::int64_t stored_numel)
    : sample_numel_(sample_numel),
      target_numel_(target_numel),
      stored_numel_(stored_numel),
      class_labels_(class_labels) {
  std::size_t bytes = 0;
  for (int s = 0; s < kSlots; ++s) {
    const std::string slot = "InputStage::slot" + std::to_string(s);
    // The batch is the first linear layer's GEMM operand beside its weight gradient:
    // at the same offset within a 4 KB page, the MLP's first-layer weight-gradient
    // GEMM ran 1.75x slower (1,330 against 760 us per step, io.trace, AVX2 EPYC), so
    // a buffer of its own offset (make_buffer).
    slots_[s].x = make_buffer(slot + ".x", batch_size * sample_numel);
    slots_[s].labels = LabelView(slot + ".labels", std::size_t(batch_size * (class_labels ? target_numel : 1)));
    slots_[s].targets = View1(slot + ".targets", std::size_t(batch_size * (class_labels ? 1 : target_numel)));
    const std::size_t rest =
        slots_[s].labels.span() * sizeof(std::int32_t) + slots_[s].targets.span() * sizeof(float);
    bytes = slots_[s].x.span() * sizeof(float) + rest;
    if (stored_numel_ > 0) {
      boxes_host_[s].resize(std::size_t(batch_size));
#if defined(KOKKOS_ENABLE_CUDA)
      // Only the device needs its own copy of the uint8 batch: the host converts
      // straight from the loader's buffer.
      x_uint8_[s] = Kokkos::View<std::uint8_t*>(slot + ".x_uint8", std::size_t(batch_size * stored_numel_));
      boxes_[s] = Kokkos::View<std::int32_t*>(slot + ".boxes", std::size_t(batch_size) * 5);
      bytes = std::max(bytes, x_uint8_[s].span() + boxes_[s].span() * sizeof(std::int32_t) + rest);
#endif
    }
  }
#if defined(KOKKOS_ENABLE_CUDA)
  copies_ = std::make_unique<cuda::BatchCopies>(Kokkos::DefaultExecutionSpace().cuda_stream(), kSlots, bytes);
#else
  (void)bytes;
#endif
}

InputStage::~InputStage() = default;

int InputStage::put(const Batch& batch, const BatchTransform* t) {
  const int s = next_;
  next_ = (next_ + 1) % kSlots;
  const Inputs& in = slots_[s];
  const bool uint8 = !batch.x_uint8.empty();
  if (uint8 && (!t || !t->transform || stored_numel_ <= 0 || t->in.numel() > stored_numel_ ||
                t->transform->output_numel() != sample_numel_))
    throw std::logic_error("InputStage::put: a uint8 batch needs a transform that fits the slots");
  pending_[s] = BatchTransform{};
  if (uint8) {
    // The samples' draws, on the host: a few numbers per sample.
    for (std::int64_t i = 0; i < batch.size; ++i)
      boxes_host_[s][std::size_t(i)] =
          t->transform->box(t->in, t->epoch, batch.index[std::size_t(i)], t->training);
  }
  const std::size_t nx = std::size_t(batch.size * sample_numel_);
  const std::size_t nt = std::size_t(batch.size * target_numel_);
#if defined(KOKKOS_ENABLE_CUDA)
  std::vector<cuda::BatchCopies::Part> parts;
  if (uint8) {
    parts.push_back({x_uint8_[s].data(), batch.x_uint8.data(), std::size_t(batch.size * t->in.numel())});
    parts.push_back({boxes_[s].data(), boxes_host_[s].data(), std::size_t(batch.size) * sizeof(SampleBox)});
    pending_[s] = *t;
    pending_size_[s] = batch.size;
  } else {
    parts.push_back({in.x.data(), batch.x.data(), nx * sizeof(float)});
  }
  if (class_labels_)
    parts.push_back({in.labels.data(), batch.labels.data(), nt * sizeof(std::int32_t)});
  else
    parts.push_back({in.targets.data(), batch.targets.data(), nt * sizeof(float)});
  copies_->put(s, parts);
#else
  using HostIn = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  using HostLabels = Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  const auto prefix = [](std::size_t len) { return Kokkos::make_pair(std::size_t(0), len); };
  if (uint8)  // the conversion is the copy
    t->transform->apply(t->in, batch.x_uint8.data(), boxes_host_[s].data(), batch.size, in.x.data());
  else
    Kokkos::deep_copy(Kokkos::subview(in.x, prefix(nx)), HostIn(batch.x.data(), nx));
  if (class_labels_)
    Kokkos::deep_copy(Kokkos::subview(in.labels, prefix(nt)), HostLabels(batch.labels.data(), nt));
  else
    Kokkos::deep_copy(Kokkos::subview(in.targets, prefix(nt)), HostIn(batch.targets.data(), nt));
#endif
  return s;
}

Inputs InputStage::take(int slot) {
  if (copies_) copies_->acquire(slot);
  const BatchTransform& t = pending_[slot];
  if (t.transform) {  // GPU build: the uint8 batch is on the device now (ordered by acquire)
    t.transform->apply(t.in, x_uint8_[slot].data(), reinterpret_cast<const SampleBox*>(boxes_[slot].data()),
                       pending_size_[slot], slots_[slot].x.data());
    pending_[slot] = BatchTransform{};
  }
  return slots_[slot];
}

void InputStage::release(int slot) {
  if (copies_) copies_->release(slot);
}

}  // namespace ddp
