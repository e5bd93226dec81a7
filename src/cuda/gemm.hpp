#pragma once
// The GPU GEMM: src/model/gemm.hpp's row-major contract on device pointers, through
// cublasGemmEx (cublasGemmStridedBatchedEx for a batch) with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32
// shortcut for fp32 operands, unless set_tf32: CUBLAS_COMPUTE_32F_FAST_TF32) on fp32, bf16 or fp16 operands.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/dtype.hpp"

namespace ddp::cuda {

class CublasGemm {
 public:
  explicit CublasGemm(cudaStream_t stream);  // the handle runs on `stream`
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major, device
  // memory. op(A) = A^T when trans_a (A is then stored (k, m)); likewise for B.
  // A and B are of type ab; C is fp32 or of type ab. alpha and beta are fp32.
  void operator()(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                  const void* b, int ldb, float beta, void* c, int ldc, DType ab = DType::F32,
                  DType c_type = DType::F32);

  // `batch` of them in one cublasGemmStridedBatchedEx: A_i = a + i stride_a, B_i =
  // b + i stride_b, C_i = c + i stride_c, the strides in elements of each one's type.
  void batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
               long long stride_a, const void* b, int ldb, long long stride_b, float beta, void* c, int ldc,
               long long stride_c, int batch, DType ab = DType::F32);

  cublasHandle_t handle() const { return handle_; }
  // fp32 operands on TF32 tensor cores (train.tf32), or not (the default)
  void set_tf32(bool on) { tf32_ = on; }

 private:
  cublasHandle_t handle_ = nullptr;
  bool tf32_ = false;
};

}  // namespace ddp::cuda
