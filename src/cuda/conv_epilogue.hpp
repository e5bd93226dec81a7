#pragma once
// The small kernels around cuDNN's convolutions that the layers expect of the
// backend (model/backend.hpp): the bias and the fused relu after forward, the bias
// gradient, and accumulating a gradient computed in bf16/fp16 into fp32. NCHW,
// stream-ordered, no host synchronisation.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dtype.hpp"

namespace ddp::cuda {

// y (B, C, HW) = relu?(in + bias[c]), in of type `in_type` (y itself for fp32: in
// place). bias may be null. The relu keeps NaN, as PyTorch's (and the host's) does.
void bias_relu(const void* in, DType in_type, float* y, const float* bias, std::int64_t B, std::int64_t C,
               std::int64_t hw, bool relu, cudaStream_t stream);

// db (C) += sum of dy (B, C, HW) over B and HW, per channel; with add off, db = that
// sum (db not read).
void bias_grad(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw, bool add,
               cudaStream_t stream);

// out[i] += in[i] (of type in_type), n elements; with add off, out[i] = in[i] widened.
void accumulate(const void* in, DType in_type, float* out, std::size_t n, bool add, cudaStream_t stream);

}  // namespace ddp::cuda
