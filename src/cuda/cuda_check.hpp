#pragma once
// The CUDA half of the check family (see comm/check.hpp): every CUDA runtime,
// cuBLAS, cuDNN and NCCL call goes through one of these. A failure reports
// `rank N (host): file:line: call failed: <the library's own error string>` and
// aborts the whole job with MPI_Abort. Nothing here is compiled out.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "comm/check.hpp"

#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t ddp_cuda_rc_ = (call);                                         \
    if (ddp_cuda_rc_ != cudaSuccess)                                           \
      DDP_FATAL(#call << " failed: " << cudaGetErrorName(ddp_cuda_rc_) << ": " \
                      << cudaGetErrorString(ddp_cuda_rc_));                    \
  } while (0)

#define CUBLAS_CHECK(call)                                                          \
  do {                                                                              \
    cublasStatus_t ddp_cublas_rc_ = (call);                                         \
    if (ddp_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                    \
      DDP_FATAL(#call << " failed: " << cublasGetStatusName(ddp_cublas_rc_) << ": " \
                      << cublasGetStatusString(ddp_cublas_rc_));                    \
  } while (0)

#define CUDNN_CHECK(call)                                                    \
  do {                                                                       \
    cudnnStatus_t ddp_cudnn_rc_ = (call);                                    \
    if (ddp_cudnn_rc_ != CUDNN_STATUS_SUCCESS)                               \
      DDP_FATAL(#call << " failed: " << cudnnGetErrorString(ddp_cudnn_rc_)); \
  } while (0)

// ncclGetLastError adds the detail NCCL logged for the failure (a peer that went
// away, an IB error), where the status string alone says "unhandled system error".
#define NCCL_CHECK(call)                                                         \
  do {                                                                           \
    ncclResult_t ddp_nccl_rc_ = (call);                                          \
    if (ddp_nccl_rc_ != ncclSuccess)                                             \
      DDP_FATAL(#call << " failed: " << ncclGetErrorString(ddp_nccl_rc_) << " (" \
                      << ncclGetLastError(nullptr) << ")");                      \
  } while (0)

namespace ddp::cuda {
// Whether `stream` is being captured into a CUDA graph (where the host must not wait
// on it, nor time it).
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status == cudaStreamCaptureStatusActive;
}
}  // namespace ddp::cuda
