#pragma once
// cuDNN's batch norm for BatchNorm2d's training passes (model/backend.hpp,
// BatchNormKernels): cudnnBatchNormalizationForwardTrainingEx / BackwardEx in mode
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT on NHWC bf16/fp16 tensors with fp32 scale, bias
// and statistics, ops BN, BN + ReLU or BN + add + ReLU: the kernels PyTorch's cuDNN
// batch norm runs on channels_last. One handle on the backend's stream; the
// workspace grows stream-ordered, as the convolutions' does.

#include <cuda_runtime.h>

#include <memory>

#include "model/backend.hpp"

namespace ddp::cuda {

std::unique_ptr<BatchNormKernels> make_cudnn_batch_norm(cudaStream_t stream);

}  // namespace ddp::cuda
