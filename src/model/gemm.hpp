#pragma once
// The one GEMM of the code base. Row-major, raw pointers in Kokkos's default memory
// space: the process's compute backend (model/backend.hpp) runs it, oneDNN on the
// host or cuBLAS on the rank's stream.

#include <cstdint>

#include "model/precision.hpp"

namespace ddp {

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major.
// op(A) = A^T when trans_a (A is then stored (k, m)); likewise for B.
// `precision`: the operands A and B are rounded to it, the products accumulate in
// fp32 and C stays fp32 (src/model/precision.hpp).
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, Precision precision = Precision::fp32);

// `batch` GEMMs of one shape: C_i (m, n) = alpha op(A_i) op(B_i) + beta C_i with
// A_i = a + i stride_a, B_i = b + i stride_b, C_i = c + i stride_c (in floats); the
// C_i must not overlap. One library call where the backend has one (cuBLAS).
void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch, Precision precision = Precision::fp32);

// The steps between a batch's operands, in floats: A, B and C.
struct GemmSteps {
  std::int64_t a, b, c;
};

// groups x batch GEMMs of one shape: the i-th of group g takes A at a + g group.a +
// i item.a, B and C likewise; no two C overlap. Attention's per-head products over a
// batch of samples: the heads' step is a few columns, the samples' a few rows of qkv,
// which no single stride spans (ComputeBackend::gemm_batched_groups).
void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                         GemmSteps item, int groups, GemmSteps group, Precision precision = Precision::fp32);

}  // namespace ddp
