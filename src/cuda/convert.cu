// fp32 <-> bf16/fp16 casts, built for every architecture in CMAKE_CUDA_ARCHITECTURES.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/dtype.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {
constexpr int kThreads = 256;

template <class T>
__device__ T from_float(float x);
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

template <class T>
__global__ void narrow(const float* in, T* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(in[i]);
}
template <class T>
__global__ void widen(const T* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = to_float(in[i]);
}

unsigned blocks(std::size_t n) {
  std::size_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 ? (b ? b : 1) : 65535);  // grid-stride loops cover the rest
}
template <class T>
__global__ void round_through(const float* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = to_float(from_float<T>(in[i]));
}
}  // namespace

void round_to(const float* in, float* out, DType to, std::size_t n, cudaStream_t stream) {
  if (n == 0 || (to == DType::F32 && in == out)) return;
  const auto launch = kernel_trace::cuda_launch("round_to", dtype_name(to));
  if (to == DType::F32) {
    CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  } else if (to == DType::BF16) {
    round_through<__nv_bfloat16><<<blocks(n), kThreads, 0, stream>>>(in, out, n);
  } else {
    round_through<__half><<<blocks(n), kThreads, 0, stream>>>(in, out, n);
  }
  CUDA_CHECK(cudaGetLastError());
}

void convert_from_f32(const float* in, void* out, DType to, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto launch = kernel_trace::cuda_launch("convert fp32 to", dtype_name(to));
  if (to == DType::F32) {
    CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  } else if (to == DType::BF16) {
    narrow<<<blocks(n), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
  } else {
    narrow<<<blocks(n), kThreads, 0, stream>>>(in, static_cast<__half*>(out), n);
  }
  CUDA_CHECK(cudaGetLastError());
}

void convert_to_f32(const void* in, DType from, float* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto launch = kernel_trace::cuda_launch("convert to fp32 from", dtype_name(from));
  if (from == DType::F32) {
    CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  } else if (from == DType::BF16) {
    widen<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, n);
  } else {
    widen<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(in), out, n);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ddp::cuda
