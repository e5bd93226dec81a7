#include "model/gelu.hpp"

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/exp_fast.hpp"

namespace ddp {

namespace {
// PyTorch's constants (aten/src/ATen/native/cpu/Activation.cpp), in float as its
// float kernels use them.
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi): the normal pdf's factor
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// The exact form: y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); dy/dx = Phi(x) + x phi(x).
// Phi by normal_cdf (model/exp_fast.hpp), which the compiler vectorises on the host.
KOKKOS_INLINE_FUNCTION float gelu_exact(float x) { return x * normal_cdf(x); }
KOKKOS_INLINE_FUNCTION float gelu_exact_grad(float x) {
  return normal_cdf(x) + x * kInvSqrt2Pi * exp_fast(-0.5f * x * x);
}

// The tanh form: y = 0.5 x (1 + t), t = tanh(u), u = sqrt(2/pi) (x + kappa x^3),
// computed as y = x s, s = 0.5 (1 + t) = 1 / (1 + exp(-2 u)): the same function, by
// exp, not tanh (on a 2-core EPYC glibc's tanhf took 31 ns an element and expf 7;
// gpt_tiny's step spent 34 of its 61 ms in this layer), and by exp_fast, which the
// compiler vectorises (model/exp_fast.hpp). Where u is very negative, exp(-2 u) is
// inf, s 0 and y -0, as with tanh.
// dy/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 kappa x^2).
KOKKOS_INLINE_FUNCTION float gelu_tanh_s(float x, float x2) {
  return 1.0f / (1.0f + exp_fast(-2.0f * kSqrt2OverPi * (x + kKappa * x2 * x)));
}
KOKKOS_INLINE_FUNCTION float gelu_tanh(float x) { return x * gelu_tanh_s(x, x * x); }
KOKKOS_INLINE_FUNCTION float gelu_tanh_grad(float x) {
  const float x2 = x * x, s = gelu_tanh_s(x, x2);
  return s + 2.0f * x * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kKappa * x2);
}

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
