#include "model/gemm.hpp"

#include <cblas.h>

#include <string>

#include "model/kernel_trace.hpp"

namespace ddp {

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;  // an empty batch: BLAS would reject ldc = 0 shapes
  const auto call = [=] {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc);
  };
  call();
  if (kernel_trace::recording())
    kernel_trace::record({"gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k),
                          2.0 * m * n * k, call});
}

}  // namespace ddp
