#include "model/precision.hpp"

#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "comm/check.hpp"

namespace ddp {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  throw InputError("precision '" + name + "' is not one of 'fp32', 'bf16', 'fp16'");
}

std::string missing_tensor_cores(Precision p, int major, int minor) {
  const int need = p == Precision::bf16 ? 8 : p == Precision::fp16 ? 7 : 0;
  if (major >= need) return {};
  return "compute capability " + std::to_string(major) + "." + std::to_string(minor) + " has no " +
         precision_name(p) + " tensor cores (they need " + std::to_string(need) + ".0, " +
         (need == 8 ? "Ampere" : "Volta") + ", or newer)";
}

float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // inf stays inf; NaN stays NaN (quiet)
    if (u & 0x007fffffu) u |= 0x00400000u;
    u &= 0xffff0000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; may carry into inf
    u &= 0xffff0000u;
  }
  std::memcpy(&x, &u, 4);
  return x;
}

float round_fp16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, NaN
  const float a = std::fabs(x);
  if (a < 6.103515625e-05f)  // below fp16's smallest normal 2^-14: multiples of 2^-24
    return std::nearbyint(x * 16777216.0f) * 5.9604644775390625e-08f;
  u += 0x0fffu + ((u >> 13) & 1u);  // 10 mantissa bits, to nearest, ties to even
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return std::fabs(x) > 65504.0f ? std::copysign(INFINITY, x) : x;
}

namespace {
#if defined(__x86_64__)
// F16C (every x86-64 server CPU since 2012): 8 at a time through the hardware
// conversion, which rounds to nearest even like round_fp16.
__attribute__((target("avx,f16c"))) std::int64_t round_fp16_f16c(const float* in, float* out,
                                                                 std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}
const bool have_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif
}  // namespace

void round_to_precision(Precision p, const float* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  switch (p) {
    case Precision::fp32:
      if (in != out) std::memcpy(out, in, std::size_t(n) * sizeof(float));
      return;
    case Precision::bf16:
      for (; i < n; ++i) out[i] = round_bf16(in[i]);
      return;
    case Precision::fp16:
#if defined(__x86_64__)
      if (have_f16c) i = round_fp16_f16c(in, out, n);
#endif
      for (; i < n; ++i) out[i] = round_fp16(in[i]);
      return;
  }
}

}  // namespace ddp
