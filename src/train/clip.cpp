#include "train/clip.hpp"

namespace ddp {

double grad_sum_of_squares(ConstView1 grads, std::size_t begin, std::size_t end, float scale) {
  double sum = 0.0;
  // In double: no overflow from any float gradient (squares up to 1.2e77), so the sum
  // is non-finite exactly when some gradient is, and the rounding of the norm stays
  // far below float's (PyTorch's float32 norm differs from it by ~1e-7 relative).
  Kokkos::parallel_reduce(
      "clip::grad_sum_of_squares", Range(begin, end),
      KOKKOS_LAMBDA(std::size_t i, double& acc) {
        const double g = double(grads(i) * scale);
        acc += g * g;
      },
      sum);
  return sum;
}

double clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace ddp
