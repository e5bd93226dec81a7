#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/conv_epilogue.hpp"
#include "cuda/cuda_check.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {
constexpr int kThreads = 256;

__device__ float load(const float* p, std::int64_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, std::int64_t i) { return __bfloat162float(p[i]); }
__device__ float load(const __half* p, std::int64_t i) { return __half2float(p[i]); }

unsigned blocks(std::int64_t n) {
  std::int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 ? (b ? b : 1) : 65535);  // grid-stride loops cover the rest
}

// One grid-stride pass over (B, C, HW); blockIdx.y walks the planes in chunks.
template <class T>
__global__ void bias_relu_kernel(const T* in, float* y, const float* bias, std::int64_t C, std::int64_t hw,
                                 std::int64_t n, bool relu) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float v = load(in, i);
    if (bias) v += bias[(i / hw) % C];
    // !(v <= 0): NaN passes, as the host's relu_passes.
    y[i] = relu && v <= 0.0f ? 0.0f : v;
  }
}

// One block per channel: its B * HW values summed in a fixed order (deterministic).
__global__ void bias_grad_kernel(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw,
                                 bool add) {
  __shared__ float partial[kThreads];
  const std::int64_t c = blockIdx.x;
  float s = 0.0f;
  for (std::int64_t b = 0; b < B; ++b) {
    const float* plane = dy + (b * C + c) * hw;
    for (std::int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += plane[i];
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = add ? db[c] + partial[0] : partial[0];
}

template <class T>
__global__ void accumulate_kernel(const T* in, float* out, std::size_t n, bool add) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = load(in, std::int64_t(i));
    out[i] = add ? out[i] + v : v;
  }
}
}  // namespace

void bias_relu(const void* in, DType in_type, float* y, const float* bias, std::int64_t B, std::int64_t C,
               std::int64_t hw, bool relu, cudaStream_t stream) {
  const std::int64_t n = B * C * hw;
  if (n == 0 || (!bias && !relu && in_type == DType::F32 && in == y)) return;
  kernel_trace::count_cuda_launch();
  switch (in_type) {
    case DType::F32:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const float*>(in), y, bias, C, hw, n,
                                                           relu);
      break;
    case DType::BF16:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), y, bias, C,
                                                           hw, n, relu);
      break;
    case DType::F16:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(in), y, bias, C, hw, n,
                                                           relu);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

void bias_grad(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw, bool add,
               cudaStream_t stream) {
  if (C == 0 || (B == 0 && add)) return;
  kernel_trace::count_cuda_launch();
  bias_grad_kernel<<<unsigned(C), kThreads, 0, stream>>>(dy, db, B, C, hw, add);
  CUDA_CHECK(cudaGetLastError());
}

void accumulate(const void* in, DType in_type, float* out, std::size_t n, bool add, cudaStream_t stream) {
  if (n == 0) return;
  kernel_trace::count_cuda_launch();
  switch (in_type) {
    case DType::F32:
      accumulate_kernel<<<blocks(std::int64_t(n)), kThreads, 0, stream>>>(static_cast<const float*>(in), out,
                                                                          n, add);
      break;
    case DType::BF16:
      accumulate_kernel<<<blocks(std::int64_t(n)), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(in), out, n, add);
      break;
    case DType::F16:
      accumulate_kernel<<<blocks(std::int64_t(n)), kThreads, 0, stream>>>(static_cast<const __half*>(in), out,
                                                                          n, add);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ddp::cuda
