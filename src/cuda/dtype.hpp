#pragma once
// Element types of GEMM and convolution operands on the GPU. Accumulation is fp32
// for all three.

#include <cuda_runtime.h>
#include <cudnn.h>
#include <library_types.h>

#include <cstddef>

namespace ddp::cuda {

enum class DType { F32, BF16, F16 };

inline cudaDataType_t cuda_type(DType t) {
  return t == DType::F32 ? CUDA_R_32F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}
inline cudnnDataType_t cudnn_type(DType t) {
  return t == DType::F32 ? CUDNN_DATA_FLOAT : t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}
inline std::size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::F32 ? "fp32" : t == DType::BF16 ? "bf16" : "fp16";
}

// out[i] = in[i] rounded to `to` (round to nearest even), and back: the operand
// casts of mixed precision. Stream-ordered, no host synchronisation.
void convert_from_f32(const float* in, void* out, DType to, std::size_t n, cudaStream_t stream);
void convert_to_f32(const void* in, DType from, float* out, std::size_t n, cudaStream_t stream);
// out[i] = in[i] rounded to `to`'s nearest value (ties to even; fp16 overflows to
// inf), kept in fp32: the host's round_to_precision on the device.
void round_to(const float* in, float* out, DType to, std::size_t n, cudaStream_t stream);

}  // namespace ddp::cuda
