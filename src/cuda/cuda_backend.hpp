#pragma once
// The device compute backend (model/backend.hpp) of the CUDA build: cuBLAS GEMMs
// and cuDNN convolutions on device pointers, on the rank's stream (Kokkos's own, so
// the Kokkos kernels before and after are ordered with them without a host wait).
//
// fp32 stays fp32 (no TF32: CUBLAS_COMPUTE_32F, CUDNN_FMA_MATH), so a step agrees
// with the host's to fp32 rounding. bf16 and fp16 GEMMs run the tensor cores:
// operands cast on the device into scratch, fp32 accumulation and C. bf16 and fp16
// convolutions run cuDNN's bf16/fp16 tensor-core kernels on channels-last
// activations; DDP_CUDNN_NARROW=0 rounds their operands and runs cuDNN's fp32 kernels
// instead, which is what the host does (cuda_backend.cpp, CudnnConvKernels). Algorithms are chosen once
// per shape from cuDNN's heuristics, deterministic ones first, so a run is
// repeatable bit for bit (stop-and-resume equals a straight run).

#include <cuda_runtime.h>

#include <memory>

#include "model/backend.hpp"

namespace ddp::cuda {

std::unique_ptr<ComputeBackend> make_cuda_backend(cudaStream_t stream);

}  // namespace ddp::cuda
