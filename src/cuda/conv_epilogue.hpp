#pragma once
// The small kernels around cuDNN's convolutions that the layers expect of the
// backend (model/backend.hpp): the bias and the fused relu after forward, the bias
// gradient, accumulating a gradient computed in bf16/fp16 into fp32, and the moves
// between NCHW and channels-last (NHWC) with their type casts. Stream-ordered, no
// host synchronisation.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dtype.hpp"

namespace ddp::cuda {

// y (B, C, HW) = relu?(in + bias[c]), in of type `in_type` (y itself for fp32: in
// place), both NCHW or both NHWC (nhwc). bias may be null. The relu keeps NaN, as
// PyTorch's (and the host's) does.
void bias_relu(const void* in, DType in_type, float* y, const float* bias, std::int64_t B, std::int64_t C,
               std::int64_t hw, bool relu, bool nhwc, cudaStream_t stream);

// db (C) += sum of dy (B, C, HW) over B and HW, per channel; with add off, db = that
// sum (db not read). dy NCHW or NHWC (nhwc): the same order of additions either way.
void bias_grad(const float* dy, float* db, std::int64_t B, std::int64_t C, std::int64_t hw, bool add,
               bool nhwc, cudaStream_t stream);

// dst = src, an image tensor (N, C, HW) moved from NCHW to NHWC (to_nhwc) or back,
// cast from src_type to dst_type (rounding to nearest even); for an fp32 dst also
// + bias[c] where bias is given, relu?, and + dst where add. A convolution's
// weights (K, C, R, S) <-> (K, R, S, C) are the same with N = K, HW = R S.
void transpose_image(const void* src, DType src_type, void* dst, DType dst_type, bool to_nhwc, std::int64_t N,
                     std::int64_t C, std::int64_t hw, const float* bias, bool relu, bool add,
                     cudaStream_t stream);

// out[i] += in[i] (of type in_type), n elements; with add off, out[i] = in[i] widened.
void accumulate(const void* in, DType in_type, float* out, std::size_t n, bool add, cudaStream_t stream);

}  // namespace ddp::cuda
