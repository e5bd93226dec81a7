#include "model/gelu.hpp"

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/gelu_math.hpp"

namespace ddp {

namespace {
// The passes on elements of one kind (elements.hpp): fp32, or narrow where a
// transformer block keeps its inner activations so (x, y, dy and dx of one type).
template <bool Narrow>
void forward_pass(const Tensor& x, Tensor& y, bool tanh) {
  const auto xe = elements<Narrow>(x);
  const auto ye = elements<Narrow>(y);
  if (tanh)
    Kokkos::parallel_for(
        "Gelu::forward_tanh", Range(0, x.storage_numel()),
        KOKKOS_LAMBDA(std::int64_t i) { ye.set(i, gelu_tanh(xe(i))); });
  else
    Kokkos::parallel_for(
        "Gelu::forward", Range(0, x.storage_numel()),
        KOKKOS_LAMBDA(std::int64_t i) { ye.set(i, gelu_exact(xe(i))); });
}

template <bool Narrow>
void backward_pass(const Tensor& x, const Tensor& dy, Tensor& dx, bool tanh) {
  const auto xe = elements<Narrow>(x), dye = elements<Narrow>(dy);
  const auto dxe = elements<Narrow>(dx);
  if (tanh)
    Kokkos::parallel_for(
        "Gelu::backward_tanh", Range(0, x.storage_numel()),
        KOKKOS_LAMBDA(std::int64_t i) { dxe.set(i, dye(i) * gelu_tanh_grad(xe(i))); });
  else
    Kokkos::parallel_for(
        "Gelu::backward", Range(0, x.storage_numel()),
        KOKKOS_LAMBDA(std::int64_t i) { dxe.set(i, dye(i) * gelu_exact_grad(xe(i))); });
}
}  // namespace

// x: (B, sample...) -> y: (B, sample...) = gelu(x), in x's layout and type
void Gelu::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  resize_like(y, x, "Gelu::y");
  if (x.type == Precision::fp32)
    forward_pass<false>(x, y, tanh_);
  else
    forward_pass<true>(x, y, tanh_);
}

// dy: (B, sample...) -> dx: (B, sample...) = dy gelu'(x), in x's type
void Gelu::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  DDP_REQUIRE(dy.layout == x.layout, "gelu: the output gradient in another layout than the input");
  DDP_REQUIRE(dy.type == x.type, "gelu: the output gradient is " << precision_name(dy.type) << ", the input "
                                                                 << precision_name(x.type));
  resize_like(dx, x, "Gelu::dx");
  if (x.type == Precision::fp32)
    backward_pass<false>(x, dy, dx, tanh_);
  else
    backward_pass<true>(x, dy, dx, tanh_);
}

}  // namespace ddp
