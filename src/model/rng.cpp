#include "model/rng.hpp"

#include "model/tensor.hpp"

namespace ddp {

void fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t key) {
  Kokkos::parallel_for(
      "Rng::fill_uniform", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { p[i] = lo + (hi - lo) * u01(hash64(key, i)); });
}

void fill_normal(float* p, std::int64_t n, float mean, float stddev, std::uint64_t key) {
#if KOKKOS_VERSION >= 30700
  using Kokkos::cos;
  using Kokkos::log;
  using Kokkos::sqrt;
#else
  using Kokkos::Experimental::cos;
  using Kokkos::Experimental::log;
  using Kokkos::Experimental::sqrt;
#endif
  Kokkos::parallel_for(
      "Rng::fill_normal", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const auto c = static_cast<std::uint64_t>(i);
        // u1 in (0, 1]: never log(0); u2 in [0, 1).
        const double u1 = (double(hash64(key, 2 * c) >> 11) + 1.0) * 0x1.0p-53,
                     u2 = double(hash64(key, 2 * c + 1) >> 11) * 0x1.0p-53;
        const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        p[i] = mean + stddev * static_cast<float>(z);
      });
}

}  // namespace ddp
