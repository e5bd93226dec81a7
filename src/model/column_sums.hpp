#pragma once
// Parameter gradients that are column sums over the rows of a (rows, n) table (layer
// norm's weight and bias, attention's biases), in double, in an order fixed by the
// row count alone: the same bits on any device and thread count for the same rows.

#include <cmath>
#include <cstdint>

#include "model/tensor.hpp"  // Range

namespace ddp {

// Rows of a stretch for `rows` rows: about sqrt(rows), so that neither a stretch's sum
// nor the sum over the stretches is a long chain of reads.
inline std::int64_t stretch_rows(std::int64_t rows) {
  const std::int64_t r = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(rows))));
  return r < 1 ? 1 : r;
}

// out[m][j] (+)= the sum over rows r of term(r, j)[m], for M terms (term gives a
// Kokkos::Array<double, M>): each stretch of stretch_rows(rows) rows summed from 0.0
// in the order of r into partial (M, K, n), grown to fit; then the K stretches' sums in
// order, rounded to float once, added to out (add) or written.
// On the GPU a thread per (stretch, column), adjacent threads on adjacent columns. On
// the host a thread per stretch, adding each row's columns in one loop over the row
// (contiguous, vectorised): every column's sum is the same chain of additions either
// way, so the same bits (a thread per column would read the table a column at a time).
template <int M, class Term>
void column_sums(const char* stretch_label, const char* sum_label, std::int64_t rows, std::int64_t n,
                 Kokkos::View<double*>& partial, const Term& term, float* const (&out)[M], bool add) {
  static_assert(M == 1 || M == 2, "column_sums takes one or two terms");
  const std::int64_t R = stretch_rows(rows), K = (rows + R - 1) / R;
  if (static_cast<std::int64_t>(partial.extent(0)) < M * K * n)
    partial = Kokkos::View<double*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "column_sums::partial"),
                                    M * K * n);
  double* const part = partial.data();
#if defined(KOKKOS_ENABLE_CUDA)
  Kokkos::parallel_for(
      stretch_label, Range(0, K * n), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t k = p / n, j = p - k * n, r0 = k * R, r1 = r0 + R < rows ? r0 + R : rows;
        Kokkos::Array<double, M> s;
        for (int m = 0; m < M; ++m) s[m] = 0.0;
        for (std::int64_t r = r0; r < r1; ++r) {
          const Kokkos::Array<double, M> t = term(r, j);
          for (int m = 0; m < M; ++m) s[m] += t[m];
        }
        for (int m = 0; m < M; ++m) part[(m * K + k) * n + j] = s[m];
      });
#else
  Kokkos::parallel_for(
      stretch_label, Range(0, K), KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t r0 = k * R, r1 = r0 + R < rows ? r0 + R : rows;
        double* __restrict s0 = part + k * n;
        for (std::int64_t j = 0; j < n; ++j) s0[j] = 0.0;
        if constexpr (M == 1) {
          for (std::int64_t r = r0; r < r1; ++r)
            for (std::int64_t j = 0; j < n; ++j) s0[j] += term(r, j)[0];
        } else {
          double* __restrict s1 = part + (K + k) * n;
          for (std::int64_t j = 0; j < n; ++j) s1[j] = 0.0;
          for (std::int64_t r = r0; r < r1; ++r)
            for (std::int64_t j = 0; j < n; ++j) {
              const Kokkos::Array<double, M> t = term(r, j);
              s0[j] += t[0];
              s1[j] += t[1];
            }
        }
      });
#endif
  Kokkos::Array<float*, M> o;
  for (int m = 0; m < M; ++m) o[m] = out[m];
  Kokkos::parallel_for(
      sum_label, Range(0, n), KOKKOS_LAMBDA(std::int64_t j) {
        for (int m = 0; m < M; ++m) {
          double s = 0.0;
          for (std::int64_t k = 0; k < K; ++k) s += part[(m * K + k) * n + j];
          o[m][j] = add ? o[m][j] + static_cast<float>(s) : static_cast<float>(s);
        }
      });
}

}  // namespace ddp
