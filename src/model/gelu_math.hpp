#pragma once
// GELU's two forms and their derivatives, one element at a time: the gelu layer's
// passes (model/gelu.cpp) and a GEMM's epilogue (model/gemm.cpp: a linear's output
// through its GELU in the pass that adds its bias) compute them by these same lines,
// so the two give the same bits.

#include "model/exp_fast.hpp"

namespace ddp {

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

}  // namespace ddp
