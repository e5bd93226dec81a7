#include "model/rng.hpp"

#include "model/tensor.hpp"

namespace ddp {

void fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t key) {
  Kokkos::parallel_for(
      "Rng::fill_uniform", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { p[i] = lo + (hi - lo) * u01(hash64(key, i)); });
}

}  // namespace ddp
