#include "train/adamw_host.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>

namespace ddp {

namespace {

// Elements a run: a loop of its own over unaliased pointers.
constexpr std::size_t kRun = 4096;

// a * b + c as the per-element kernel this loop replaced had it compiled: one
// rounding where the CPU has FMA (GCC contracted its m and v updates so, and nothing
// else), two without. This file is built with -ffp-contract=off (CMakeLists.txt), so
// these are the only fused operations: the decayed parameter is rounded before the
// step is subtracted from it, as when the kernel stored it in between.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

}  // namespace

// The per-element lambda over Kokkos views that this replaces compiled to scalar
// code (the views may alias, and sqrt may set errno): 5.3 ns a parameter, 658 ms a
// step for GPT-2's 124 M on one core of an AVX-512 Xeon. Here each run is a loop the
// compiler vectorises (built with -fno-math-errno), with the same operations on each
// element: the same bits.
void adamw_update_host(float* p, const float* g, float scale, float* m, float* v, std::size_t n, float decay,
                       const std::uint8_t* decays, float beta1, float beta2, float one_minus_beta1,
                       float one_minus_beta2, float step_size, float bias_correction2_sqrt, float eps) {
  const std::size_t runs = (n + kRun - 1) / kRun;
  Kokkos::parallel_for(
      "AdamW::step", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, runs), [=](const std::size_t r) {
        const std::size_t i0 = r * kRun, len = std::min(kRun, n - i0);
        float* __restrict pr = p + i0;
        float* __restrict mr = m + i0;
        float* __restrict vr = v + i0;
        const float* __restrict gr = g + i0;
        // factor: the element's decay, 1 where the mask leaves it out
        const auto step = [&](std::size_t i, float factor) {
          const float gi = gr[i] * scale;
          const float decayed = pr[i] * factor;
          const float mi = mul_add(beta1, mr[i], one_minus_beta1 * gi);
          const float vi = mul_add(beta2, vr[i], one_minus_beta2 * gi * gi);
          const float denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
          mr[i] = mi;
          vr[i] = vi;
          pr[i] = decayed - step_size * mi / denom;
        };
        if (decays == nullptr) {
          for (std::size_t i = 0; i < len; ++i) step(i, decay);
        } else {
          const std::uint8_t* __restrict dr = decays + i0;
          for (std::size_t i = 0; i < len; ++i) step(i, dr[i] == 0 ? 1.0f : decay);
        }
      });
}

}  // namespace ddp
