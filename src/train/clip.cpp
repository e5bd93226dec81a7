#include "train/clip.hpp"

#include "comm/shares.hpp"

namespace ddp {

std::vector<double> grad_block_sums(ConstView1 grads, std::int64_t begin, std::int64_t end, float scale,
                                    Kokkos::View<double*>& scratch) {
  const std::int64_t blocks = (end - begin + kShareAlign - 1) / kShareAlign;
  if (scratch.extent(0) < std::size_t(blocks))
    scratch = Kokkos::View<double*>(Kokkos::view_alloc("clip::block_sums", Kokkos::WithoutInitializing),
                                    std::size_t(blocks));
  const Kokkos::View<double*> sums = scratch;
  // Four interleaved partial sums per block, combined in one order: the adds of one
  // chain overlap three others', and the result depends on the data alone.
  Kokkos::parallel_for(
      "clip::grad_block_sums", Range(0, std::size_t(blocks)), KOKKOS_LAMBDA(std::size_t k) {
        const std::int64_t lo = begin + std::int64_t(k) * kShareAlign;
        const std::int64_t hi = lo + kShareAlign < end ? lo + kShareAlign : end;
        double acc[4] = {0.0, 0.0, 0.0, 0.0};
        for (std::int64_t i = lo; i < hi; ++i) {
          const double g = double(grads(std::size_t(i)) * scale);
          acc[(i - lo) & 3] += g * g;
        }
        sums(k) = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      });
  std::vector<double> out(static_cast<std::size_t>(blocks));
  Kokkos::deep_copy(Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                        out.data(), out.size()),
                    Kokkos::subview(sums, std::make_pair(std::size_t(0), std::size_t(blocks))));
  return out;
}

double sum_in_order(const std::vector<double>& block_sums) {
  double total = 0.0;
  for (double s : block_sums) total += s;
  return total;
}

double clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace ddp
