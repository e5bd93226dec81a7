#pragma once
// exp(x) in float for the element-wise kernels that call it once an element (GELU,
// attention's softmax): on the host a form GCC vectorises, on the device CUDA's expf.
// glibc's expf is a call the vectoriser cannot widen: on a 2-core Xeon (AVX-512) it
// left gpt_tiny's GELU at 10 ns an element, 6.2 of its 21.7 ms step.
//
// Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, Cody and Waite), e^r
// by its degree-7 polynomial, times 2^n built from the exponent bits in two halves so
// that results in the subnormal range and past FLT_MAX come out as expf's (0 and inf
// at the ends). Within 1.5 ulp of exp over the normal range (checked against exp in
// double over the floats in [-87, 88.7]: layers_test's ExpFast); NaN stays NaN;
// -inf gives 0 and +inf inf. The rounding to n adds and subtracts 1.5 2^23, which
// leaves n's value in the low bits of the sum: no float-to-int conversion (which the
// vectoriser handles less well, and which is undefined for NaN).

#include <cstdint>

#include "model/elements.hpp"  // float_bits, bits_float

namespace ddp {

KOKKOS_INLINE_FUNCTION float exp_fast(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  constexpr float kRound = 12582912.0f;  // 1.5 2^23: x + kRound rounds x to an integer
  x = x > 89.0f ? 89.0f : x;             // past ln(FLT_MAX) = 88.72: inf below
  x = x < -150.0f ? -150.0f : x;         // below ln(the least subnormal) = -103.3: 0 below
  const float t = x * 1.44269504088896341f + kRound, n = t - kRound;  // n = round(x / ln2)
  const std::int32_t k = static_cast<std::int32_t>(float_bits(t) - float_bits(kRound));
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // x - n ln2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;  // e^r
  // 2^k as 2^k1 2^k2, each a normal float for k in [-216, 128]
  const std::int32_t k1 = k >> 1, k2 = k - k1;
  return p * bits_float(static_cast<std::uint32_t>(k1 + 127) << 23) *
         bits_float(static_cast<std::uint32_t>(k2 + 127) << 23);
#endif
}

// Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF: the exact GELU's x Phi(x)
// and its gradient's first term. On the host a form GCC vectorises (glibc's erff is a
// call it cannot widen: vit_fashion's two exact GELUs took 9.2 of its 19.7 ms step on
// a 2-core Xeon), on the device CUDA's erff.
//
// erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0, P of degree 9: the
// Chebyshev fit of Numerical Recipes' erfcc, relative error under 1.2e-7 for every
// z >= 0 (checked in double: 1.04e-7 at most over [0, 9]). So Phi(x) = erfc(|z|) / 2
// for x < 0 and 1 - erfc(|z|) / 2 for x >= 0 (z = x / sqrt 2), in float within a few
// ulp of Phi wherever it is a normal float (layers_test's NormalCdf), with no
// cancellation in the lower tail (where 1 + erf(z) loses its digits). NaN stays NaN.
KOKKOS_INLINE_FUNCTION float normal_cdf(float x) {
#if defined(__CUDA_ARCH__)
  return 0.5f * erfcf(-x * 0.70710678118654752440f);
#else
  const float z = (x < 0.0f ? -x : x) * 0.70710678118654752440f, t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float half_erfc = 0.5f * t * exp_fast(p - z * z);
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
#endif
}

}  // namespace ddp
