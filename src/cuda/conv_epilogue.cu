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
__device__ void store(float* p, std::int64_t i, float v) { p[i] = v; }
__device__ void store(__nv_bfloat16* p, std::int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ void store(__half* p, std::int64_t i, float v) { p[i] = __float2half_rn(v); }

unsigned blocks(std::int64_t n) {
  std::int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 ? (b ? b : 1) : 65535);  // grid-stride loops cover the rest
}

// One grid-stride pass over (B, C, HW); blockIdx.y walks the planes in chunks.
template <class T>
__global__ void bias_relu_kernel(const T* in, float* y, const float* bias, std::int64_t C, std::int64_t hw,
                                 std::int64_t n, bool relu, bool nhwc) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float v = load(in, i);
    if (bias) v += bias[nhwc ? i % C : (i / hw) % C];
    // !(v <= 0): NaN passes, as the host's relu_passes.
    y[i] = relu && v <= 0.0f ? 0.0f : v;
  }
}

// One block per channel: its B * HW values summed in a fixed order (deterministic),
// the same in NCHW and NHWC (there a pixel's channel c at stride C).
__global__ void bias_grad_kernel(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw,
                                 bool add, bool nhwc) {
  __shared__ float partial[kThreads];
  const std::int64_t c = blockIdx.x, step = nhwc ? C : 1;
  float s = 0.0f;
  for (std::int64_t b = 0; b < B; ++b) {
    const float* plane = dy + (nhwc ? b * hw * C + c : (b * C + c) * hw);
    for (std::int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += plane[i * step];
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
// dst element e of (N, C, HW) in dst's layout from src's element in the other one; a
// grid-stride pass in dst's order, so the stores are coalesced.
template <class S, class D>
__global__ void transpose_kernel(const S* src, D* dst, bool to_nhwc, std::int64_t C, std::int64_t hw,
                                 std::int64_t n, const float* bias, bool relu, bool add) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < n;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t b, c, i;
    if (to_nhwc) {  // e = (b * hw + i) * C + c
      const std::int64_t p = e / C;
      c = e - p * C;
      b = p / hw;
      i = p - b * hw;
    } else {  // e = (b * C + c) * hw + i
      const std::int64_t p = e / hw;
      i = e - p * hw;
      b = p / C;
      c = p - b * C;
    }
    float v = load(src, to_nhwc ? (b * C + c) * hw + i : (b * hw + i) * C + c);
    if (bias) v += bias[c];
    if (relu && v <= 0.0f) v = 0.0f;  // !(v <= 0) passes, NaN too
    if (add) v += load(dst, e);
    store(dst, e, v);
  }
}

template <class S>
void transpose_to(const S* src, void* dst, DType dst_type, bool to_nhwc, std::int64_t C, std::int64_t hw,
                  std::int64_t n, const float* bias, bool relu, bool add, cudaStream_t stream) {
  switch (dst_type) {
    case DType::F32:
      transpose_kernel<<<blocks(n), kThreads, 0, stream>>>(src, static_cast<float*>(dst), to_nhwc, C, hw, n,
                                                           bias, relu, add);
      break;
    case DType::BF16:
      transpose_kernel<<<blocks(n), kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), to_nhwc, C,
                                                           hw, n, bias, relu, add);
      break;
    case DType::F16:
      transpose_kernel<<<blocks(n), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), to_nhwc, C, hw, n,
                                                           bias, relu, add);
      break;
  }
}
}  // namespace

void transpose_image(const void* src, DType src_type, void* dst, DType dst_type, bool to_nhwc, std::int64_t N,
                     std::int64_t C, std::int64_t hw, const float* bias, bool relu, bool add,
                     cudaStream_t stream) {
  const std::int64_t n = N * C * hw;
  if (n == 0) return;
  DDP_REQUIRE(dst_type == DType::F32 || (!bias && !relu && !add),
              "transpose_image: bias, relu and add need an fp32 destination");
  const auto launch =
      kernel_trace::cuda_launch(to_nhwc ? "transpose to NHWC" : "transpose to NCHW", dtype_name(dst_type));
  switch (src_type) {
    case DType::F32:
      transpose_to(static_cast<const float*>(src), dst, dst_type, to_nhwc, C, hw, n, bias, relu, add, stream);
      break;
    case DType::BF16:
      transpose_to(static_cast<const __nv_bfloat16*>(src), dst, dst_type, to_nhwc, C, hw, n, bias, relu, add,
                   stream);
      break;
    case DType::F16:
      transpose_to(static_cast<const __half*>(src), dst, dst_type, to_nhwc, C, hw, n, bias, relu, add,
                   stream);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

void bias_relu(const void* in, DType in_type, float* y, const float* bias, std::int64_t B, std::int64_t C,
               std::int64_t hw, bool relu, bool nhwc, cudaStream_t stream) {
  const std::int64_t n = B * C * hw;
  if (n == 0 || (!bias && !relu && in_type == DType::F32 && in == y)) return;
  const auto launch = kernel_trace::cuda_launch("bias_relu from", dtype_name(in_type));
  switch (in_type) {
    case DType::F32:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const float*>(in), y, bias, C, hw, n,
                                                           relu, nhwc);
      break;
    case DType::BF16:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), y, bias, C,
                                                           hw, n, relu, nhwc);
      break;
    case DType::F16:
      bias_relu_kernel<<<blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(in), y, bias, C, hw, n,
                                                           relu, nhwc);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

void bias_grad(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw, bool add,
               bool nhwc, cudaStream_t stream) {
  if (C == 0 || (B == 0 && add)) return;
  const auto launch = kernel_trace::cuda_launch("bias_grad", nhwc ? "NHWC" : "NCHW");
  bias_grad_kernel<<<unsigned(C), kThreads, 0, stream>>>(dy, db, B, C, hw, add, nhwc);
  CUDA_CHECK(cudaGetLastError());
}

void accumulate(const void* in, DType in_type, float* out, std::size_t n, bool add, cudaStream_t stream) {
  if (n == 0) return;
  const auto launch = kernel_trace::cuda_launch("accumulate from", dtype_name(in_type));
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
