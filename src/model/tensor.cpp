#include "model/tensor.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <sstream>

#include "comm/check.hpp"  // DDP_REQUIRE

namespace ddp {

void require_nchw(const Tensor& t, Precision type, const char* layer, const char* what) {
  DDP_REQUIRE(t.type == type && t.layout == Layout::nchw,
              layer << ": " << what << " is " << precision_name(t.type) << " in " << layout_name(t.layout)
                    << ", not " << precision_name(type) << " in nchw");
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ")";
  return os.str();
}

std::int64_t Tensor::storage_numel() const {
  if (channel_block(layout) == 1) return numel();  // nchw, nhwc
  const std::int64_t c = shape[1], block = channel_block(layout), padded = (c + block - 1) / block * block;
  return numel() / c * padded;
}

std::int64_t planned_floats(std::int64_t batch, const Shape& sample, Layout layout, Precision type) {
  Tensor t;
  t.shape = {batch};
  t.shape.insert(t.shape.end(), sample.begin(), sample.end());
  t.layout = layout;
  t.type = type;
  return t.storage_floats();
}

namespace {
std::atomic<bool> skew_buffers{true};
}  // namespace

void set_buffer_skew(bool on) { skew_buffers = on; }

View1 make_buffer(const std::string& label, std::int64_t n, bool uninitialised) {
  auto alloc = [&](std::int64_t size) {
    return uninitialised ? View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), size)
                         : View1(label, size);
  };
#if defined(KOKKOS_ENABLE_CUDA)
  return alloc(n);
#else
  if (!skew_buffers) return alloc(n);
  // The k-th buffer's first float at (k * 1,088) mod 4,096 bytes in its page, wherever
  // the allocator put the block (pages from mmap, or the heap once glibc's threshold rose).
  constexpr std::int64_t kPage = 1024, kStep = 272;  // floats: 4 KB, 1,088 bytes
  static std::atomic<std::int64_t> made{0};
  const std::int64_t target = made++ * kStep % kPage;
  const View1 whole = alloc(n + kPage);
  const std::int64_t at =
      std::int64_t(reinterpret_cast<std::uintptr_t>(whole.data()) / sizeof(float) % kPage);
  const std::int64_t skew = (target - at + kPage) % kPage;
  return Kokkos::subview(whole, std::make_pair(skew, skew + n));
#endif
}

namespace {
void reserve(View1& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) < n) v = make_buffer(label, n, /*uninitialised=*/true);
}
}  // namespace

namespace {
struct Slots {
  std::array<View1, std::size_t(ScratchSlot::count)> views;
  std::array<bool, std::size_t(ScratchSlot::count)> held{};
  std::int64_t outgrown = 0;
};
Slots& slots() {
  static Slots s;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] { s.views.fill(View1()); });
    hooked = true;
  }
  return s;
}
}  // namespace

View1 shared_scratch(ScratchSlot slot, std::int64_t floats, const char* label) {
  View1& v = slots().views[std::size_t(slot)];
  reserve(v, floats, label);
  return v;
}

void SharedScratch::hold(View1& v, ScratchSlot slot, std::int64_t floats, const char* label) {
  bool& held = slots().held[std::size_t(slot)];
  DDP_REQUIRE(!held, "shared scratch: slot " << int(slot) << " (" << label << ") is held already");
  v = shared_scratch(slot, floats, label);
  held = true;
  held_[n_++] = {&v, slot, v.data()};
}

SharedScratch::~SharedScratch() {
  Slots& s = slots();
  for (std::size_t i = 0; i < n_; ++i) {
    if (held_[i].view->data() != held_[i].at) ++s.outgrown;
    *held_[i].view = View1();
    s.held[std::size_t(held_[i].slot)] = false;
  }
}

std::int64_t shared_scratch_outgrown() { return slots().outgrown; }

void release_shared_scratch() {
  Slots& s = slots();
  for (bool held : s.held) DDP_REQUIRE(!held, "shared scratch released while a slot is held");
  s.views.fill(View1());
}

NarrowedOnce::NarrowedOnce(ScratchSlot slot, const float* from, std::int64_t n, Precision precision,
                           const char* label, std::int64_t at_least) {
  ComputeBackend& backend = compute_backend();
  const std::int64_t floats = backend.narrow_copy_floats(std::max(n, at_least), precision);
  if (floats == 0 || n == 0) return;
  hold_.hold(copy_, slot, floats, label);
  backend.narrow_copy(from, n, precision, copy_.data());
  from_ = from;
}

NarrowedOnce::~NarrowedOnce() {
  if (from_) compute_backend().forget_narrow_copy(from_);
}

void resize(Tensor& t, std::int64_t batch, const Shape& sample, const char* label, Layout layout,
            Precision type) {
  t.shape.resize(sample.size() + 1);
  t.shape[0] = batch;
  std::copy(sample.begin(), sample.end(), t.shape.begin() + 1);
  t.layout = layout;
  t.type = type;
  reserve(t.data, t.storage_floats(), label);
}

void resize_like(Tensor& t, const Tensor& like, const char* label) { resize_like(t, like, like.type, label); }

void resize_like(Tensor& t, const Tensor& like, Precision type, const char* label) {
  t.shape = like.shape;
  t.layout = like.layout;
  t.type = type;
  reserve(t.data, t.storage_floats(), label);
}

}  // namespace ddp
