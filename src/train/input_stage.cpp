#include "train/input_stage.hpp"

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

InputStage::InputStage(std::int64_t batch_size, std::int64_t sample_numel, bool class_labels,
                       std::int64_t target_numel)
    : sample_numel_(sample_numel), target_numel_(target_numel), class_labels_(class_labels) {
  std::size_t bytes = 0;
  for (int s = 0; s < kSlots; ++s) {
    const std::string slot = "InputStage::slot" + std::to_string(s);
    // The batch is the first linear layer's GEMM operand beside its weight gradient:
    // at the same offset within a 4 KB page, the MLP's first-layer weight-gradient
    // GEMM ran 1.75x slower (1,330 against 760 us per step, io.trace, AVX2 EPYC), so
    // a buffer of its own offset (make_buffer).
    slots_[s].x = make_buffer(slot + ".x", batch_size * sample_numel);
    slots_[s].labels = LabelView(slot + ".labels", std::size_t(batch_size));
    slots_[s].targets = View1(slot + ".targets", std::size_t(batch_size * target_numel));
    bytes = slots_[s].x.span() * sizeof(float) + slots_[s].labels.span() * sizeof(std::int32_t) +
            slots_[s].targets.span() * sizeof(float);
  }
#if defined(KOKKOS_ENABLE_CUDA)
  copies_ = std::make_unique<cuda::BatchCopies>(Kokkos::DefaultExecutionSpace().cuda_stream(), kSlots, bytes);
#else
  (void)bytes;
#endif
}

InputStage::~InputStage() = default;

int InputStage::put(const Batch& batch) {
  const int s = next_;
  next_ = (next_ + 1) % kSlots;
  const Inputs& in = slots_[s];
  const std::size_t nx = std::size_t(batch.size * sample_numel_);
  const std::size_t nt = std::size_t(batch.size * target_numel_);
#if defined(KOKKOS_ENABLE_CUDA)
  std::vector<cuda::BatchCopies::Part> parts{{in.x.data(), batch.x.data(), nx * sizeof(float)}};
  if (class_labels_)
    parts.push_back({in.labels.data(), batch.labels.data(), std::size_t(batch.size) * sizeof(std::int32_t)});
  else
    parts.push_back({in.targets.data(), batch.targets.data(), nt * sizeof(float)});
  copies_->put(s, parts);
#else
  using HostIn = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  using HostLabels = Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  const auto prefix = [](std::size_t len) { return Kokkos::make_pair(std::size_t(0), len); };
  Kokkos::deep_copy(Kokkos::subview(in.x, prefix(nx)), HostIn(batch.x.data(), nx));
  if (class_labels_)
    Kokkos::deep_copy(Kokkos::subview(in.labels, prefix(std::size_t(batch.size))),
                      HostLabels(batch.labels.data(), std::size_t(batch.size)));
  else
    Kokkos::deep_copy(Kokkos::subview(in.targets, prefix(nt)), HostIn(batch.targets.data(), nt));
#endif
  return s;
}

Inputs InputStage::take(int slot) {
  if (copies_) copies_->acquire(slot);
  return slots_[slot];
}

void InputStage::release(int slot) {
  if (copies_) copies_->release(slot);
}

}  // namespace ddp
