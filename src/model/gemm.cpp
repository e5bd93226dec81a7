#include "model/gemm.hpp"

#include "model/backend.hpp"

namespace ddp {

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, Precision precision) {
  compute_backend().gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision);
}

void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch, Precision precision) {
  compute_backend().gemm_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                                 c, ldc, stride_c, batch, precision);
}

void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                         GemmSteps item, int groups, GemmSteps group, Precision precision) {
  compute_backend().gemm_batched_groups(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch,
                                        item, groups, group, precision);
}

}  // namespace ddp
