#include "model/activation.hpp"

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"
#include "model/select.hpp"

namespace ddp {

namespace {
// Kokkos moved its math functions out of Experimental in 3.7.
#if KOKKOS_VERSION >= 30700
using Kokkos::tanh;
#else
using Kokkos::Experimental::tanh;
#endif
}  // namespace

void relu_forward(ConstView1 x, View1 y, std::int64_t n) {
  Kokkos::parallel_for(
      "ReLU::forward", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { y(i) = select_or_zero(relu_passes(x(i)), x(i)); });
}

namespace {
template <bool Narrow>
void relu_backward_of(const Tensor& y, const Tensor& dy, Tensor& dx) {
  map_flat(
      "ReLU::backward", y.storage_numel(),
      KOKKOS_LAMBDA(std::int64_t, float ye, float dye) { return select_or_zero(relu_passes(ye), dye); },
      elements<Narrow>(dx), elements<Narrow>(y), elements<Narrow>(dy));
}
}  // namespace

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  DDP_REQUIRE(dy.type == y.type && dx.type == y.type, "relu backward on tensors of different types");
  if (y.type == Precision::fp32)
    relu_backward_of<false>(y, dy, dx);
  else
    relu_backward_of<true>(y, dy, dx);
}

// y = max(x, 0)
void ReLU::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  if (fused_forward_) {
    y = x;
    return;
  }
  resize_like(y, x, "ReLU::y");
  relu_forward(x.data, y.data, x.storage_numel());
}

// dx = dy * (y > 0)
void ReLU::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  if (fused_backward_) {
    dx = dy;
    return;
  }
  resize_like(dx, x, "ReLU::dx");
  relu_backward(y, dy, dx);
}

// y = tanh(x)
void Tanh::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  resize_like(y, x, "Tanh::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  Kokkos::parallel_for(
      "Tanh::forward", Range(0, x.storage_numel()), KOKKOS_LAMBDA(std::int64_t i) { yv(i) = tanh(xv(i)); });
}

// dx = dy * (1 - y^2)
void Tanh::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  resize_like(dx, x, "Tanh::dx");
  ConstView1 yv = y.data, dyv = dy.data;
  View1 dxv = dx.data;
  Kokkos::parallel_for(
      "Tanh::backward", Range(0, x.storage_numel()),
      KOKKOS_LAMBDA(std::int64_t i) { dxv(i) = dyv(i) * (1.0f - yv(i) * yv(i)); });
}

}  // namespace ddp
