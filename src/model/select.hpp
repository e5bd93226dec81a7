#pragma once
// Branch-free selection for elementwise kernels. A plain `c ? v : 0` on data (a
// relu mask, a max-pool's winner) compiles to a branch that mispredicts about half
// the time and keeps the loop from vectorising (2-3x slower measured).

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>

namespace ddp {

// c ? v : 0, by masking v's bits. Also 0 when v is inf or NaN and c is false, as
// PyTorch's threshold_backward.
KOKKOS_INLINE_FUNCTION float select_or_zero(bool c, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= 0u - static_cast<std::uint32_t>(c);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Where a relu lets its input (forward) and its gradient (backward, judged on the
// output) through: v > 0, and NaN too, as PyTorch's relu keeps NaN and its
// threshold_backward passes the gradient there (a NaN must reach the loss, where the
// fp16 overflow check sees it, as oneDNN's fused relu does).
KOKKOS_INLINE_FUNCTION bool relu_passes(float v) { return !(v <= 0.0f); }

}  // namespace ddp
