#include "model/gemm.hpp"

#include "model/backend.hpp"

namespace ddp {

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, Precision precision) {
  compute_backend().gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision);
}

}  // namespace ddp
