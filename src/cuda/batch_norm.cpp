#include "cuda/batch_norm.hpp"

#include <cudnn.h>

#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/dtype.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {

class CudnnBatchNorm final : public BatchNormKernels {
 public:
  explicit CudnnBatchNorm(cudaStream_t stream) : stream_(stream) {
    CUDNN_CHECK(cudnnCreate(&handle_));
    CUDNN_CHECK(cudnnSetStream(handle_, stream_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn_desc_));
    CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
    CUDNN_CHECK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  }
  ~CudnnBatchNorm() override {
    if (workspace_) cudaFreeAsync(workspace_, stream_);
    cudnnDestroyActivationDescriptor(relu_);
    cudnnDestroyTensorDescriptor(bn_desc_);
    cudnnDestroyTensorDescriptor(x_desc_);
    cudnnDestroy(handle_);
  }
  CudnnBatchNorm(const CudnnBatchNorm&) = delete;
  CudnnBatchNorm& operator=(const CudnnBatchNorm&) = delete;

  std::size_t reserve_bytes(const BatchNormPass& p) override {
    describe(p);
    std::size_t bytes = 0;
    CUDNN_CHECK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle_, kMode, ops(p), activation(p),
                                                                     x_desc_, &bytes));
    return bytes;
  }

  void forward_training(const BatchNormPass& p, const void* x, const void* z, void* y, const float* gamma,
                        const float* beta, float* running_mean, float* running_var, double momentum,
                        double eps, float* mean, float* invstd, void* reserve,
                        std::size_t reserve_size) override {
    describe(p);
    const cudnnTensorDescriptor_t z_desc = p.add ? x_desc_ : nullptr;
    std::size_t ws_bytes = 0;
    CUDNN_CHECK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        handle_, kMode, ops(p), x_desc_, z_desc, x_desc_, bn_desc_, activation(p), &ws_bytes));
    void* ws = workspace(ws_bytes);
    const float one = 1.0f, zero = 0.0f;
    const kernel_trace::Timed timed("cuDNN batch norm forward", ops_name(p));
    CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
        handle_, kMode, ops(p), &one, &zero, x_desc_, x, z_desc, p.add ? z : nullptr, x_desc_, y, bn_desc_,
        gamma, beta, momentum, running_mean, running_var, eps, mean, invstd, activation(p), ws, ws_bytes,
        reserve, reserve_size));
    kernel_trace::count_library_call();
  }

  void backward(const BatchNormPass& p, const void* x, const void* y, const void* dy, void* dx, void* dz,
                const float* gamma, const float* beta, float* dgamma, float* dbeta, bool accumulate,
                double eps, const float* mean, const float* invstd, void* reserve,
                std::size_t reserve_size) override {
    describe(p);
    const cudnnTensorDescriptor_t y_desc = p.relu ? x_desc_ : nullptr, dz_desc = p.add ? x_desc_ : nullptr;
    std::size_t ws_bytes = 0;
    CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle_, kMode, ops(p), x_desc_, y_desc,
                                                                  x_desc_, dz_desc, x_desc_, bn_desc_,
                                                                  activation(p), &ws_bytes));
    void* ws = workspace(ws_bytes);
    const float one = 1.0f, zero = 0.0f, param_beta = accumulate ? 1.0f : 0.0f;
    const kernel_trace::Timed timed("cuDNN batch norm backward", ops_name(p));
    CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
        handle_, kMode, ops(p), &one, &zero, &one, &param_beta, x_desc_, x, y_desc, p.relu ? y : nullptr,
        x_desc_, dy, dz_desc, p.add ? dz : nullptr, x_desc_, dx, bn_desc_, gamma, beta, dgamma, dbeta, eps,
        mean, invstd, activation(p), ws, ws_bytes, reserve, reserve_size));
    kernel_trace::count_library_call();
  }

 private:
  static constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

  static cudnnBatchNormOps_t ops(const BatchNormPass& p) {
    return p.add    ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
           : p.relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                    : CUDNN_BATCHNORM_OPS_BN;
  }
  static const char* ops_name(const BatchNormPass& p) {
    return p.add ? "bn+add+relu" : p.relu ? "bn+relu" : "bn";
  }
  cudnnActivationDescriptor_t activation(const BatchNormPass& p) const { return p.relu ? relu_ : nullptr; }

  // x's (and y's, z's, the gradients') descriptor, NHWC of the pass's type, and the
  // per-channel one of scale, bias and statistics (fp32) derived from it.
  void describe(const BatchNormPass& p) {
    DDP_REQUIRE(p.type != Precision::fp32, "cuDNN's batch norm here takes bf16 or fp16 tensors");
    DDP_REQUIRE(!p.add || p.relu, "cuDNN's batch norm adds z only before a relu");
    const DType t = p.type == Precision::bf16 ? DType::BF16 : DType::F16;
    // H x W as one side: the spatial mode takes every position of a channel alike.
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_, CUDNN_TENSOR_NHWC, cudnn_type(t), int(p.B), int(p.C),
                                           int(p.hw), 1));
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn_desc_, x_desc_, kMode));
  }

  void* workspace(std::size_t bytes) {
    if (bytes > workspace_bytes_) {
      if (workspace_) {
        CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
        // a captured step graph may point at the old block
        device_block_freed("cuDNN's batch-norm workspace (" + std::to_string(workspace_bytes_) +
                           " bytes, growing to " + std::to_string(bytes) + ")");
      }
      CUDA_CHECK(cudaMallocAsync(&workspace_, bytes, stream_));
      workspace_bytes_ = bytes;
    }
    return workspace_;
  }

  cudaStream_t stream_;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t x_desc_ = nullptr, bn_desc_ = nullptr;
  cudnnActivationDescriptor_t relu_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace

std::unique_ptr<BatchNormKernels> make_cudnn_batch_norm(cudaStream_t stream) {
  return std::make_unique<CudnnBatchNorm>(stream);
}

}  // namespace ddp::cuda
