#include "cuda/gemm.hpp"

#include "cuda/cuda_check.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

CublasGemm::CublasGemm(cudaStream_t stream) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  CUBLAS_CHECK(cublasSetStream(handle_, stream));
  // Tensor cores for bf16/fp16 operands; fp32 operands stay fp32 under COMPUTE_32F.
  CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(handle_);
}

void CublasGemm::operator()(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                            int lda, const void* b, int ldb, float beta, void* c, int ldc, DType ab,
                            DType c_type) {
  DDP_REQUIRE(c_type == DType::F32 || c_type == ab,
              "cuBLAS GEMM: C of " << dtype_name(c_type) << " with " << dtype_name(ab) << " operands");
  if (m == 0 || n == 0) return;
  const kernel_trace::Timed timed("cuBLAS gemm", tf32_ && ab == DType::F32 ? "tf32" : dtype_name(ab));
  // cuBLAS is column-major: a row-major (m, n) C is a column-major (n, m) C^T, and
  // C^T = op(B)^T op(A)^T, so the operands swap and keep their own transposes.
  CUBLAS_CHECK(cublasGemmEx(
      handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
      cuda_type(ab), ldb, a, cuda_type(ab), lda, &beta, c, cuda_type(c_type), ldc,
      tf32_ && ab == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CublasGemm::batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                         long long stride_a, const void* b, int ldb, long long stride_b, float beta, void* c,
                         int ldc, long long stride_c, int batch, DType ab) {
  if (m == 0 || n == 0 || batch == 0) return;
  const kernel_trace::Timed timed("cuBLAS gemm batched", tf32_ && ab == DType::F32 ? "tf32" : dtype_name(ab));
  // Column-major as operator(): C_i^T = op(B_i)^T op(A_i)^T, each with its stride.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
      cuda_type(ab), ldb, stride_b, a, cuda_type(ab), lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c,
      batch, tf32_ && ab == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace ddp::cuda
