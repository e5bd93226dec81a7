#pragma once
// The host backend: oneDNN on the rank's one thread (src/model/onednn/dnnl_engine.hpp).
// GEMMs through oneDNN's sgemm (fp32) and matmul (bf16 where the CPU has bf16
// kernels); convolutions through its primitives in the layouts it picks for this
// CPU. bf16 without bf16 kernels, and fp16 always, are emulated: operands rounded
// to their values, products in fp32.

#include <memory>

#include "model/backend.hpp"

namespace ddp {

std::unique_ptr<ComputeBackend> make_onednn_backend();

// The convolution kernels of one layer (onednn_conv.cpp).
std::unique_ptr<ConvKernels> make_onednn_conv(const ConvGeometry& geometry);

}  // namespace ddp
