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

}  // namespace ddp
