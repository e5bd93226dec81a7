#include "cuda/batch_norm.hpp"

#include <cudnn.h>

#include <cstdint>
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
    for (const Block* b : {&workspace_, &staging_})
      if (b->at) cudaFreeAsync(b->at, stream_);
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
    Staging st(*this, p.C);
    const float* g = st.in(gamma);
    const float* b = st.in(beta);
    float* rm = st.in_out(running_mean);
    float* rv = st.in_out(running_var);
    float* m = st.out(mean);
    float* is = st.out(invstd);
    const kernel_trace::Timed timed("cuDNN batch norm forward", ops_name(p));
    CUDNN_CHECK(cudnnBatchNormalizationForwardTrainingEx(
        handle_, kMode, ops(p), &one, &zero, x_desc_, x, z_desc, p.add ? z : nullptr, x_desc_, y, bn_desc_, g,
        b, momentum, rm, rv, eps, m, is, activation(p), ws, ws_bytes, reserve, reserve_size));
    st.write_back();
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
    Staging st(*this, p.C);
    const float* g = st.in(gamma);
    const float* b = st.in(beta);
    float* dg = accumulate ? st.in_out(dgamma) : st.out(dgamma);
    float* db = accumulate ? st.in_out(dbeta) : st.out(dbeta);
    const float* m = st.in(mean);
    const float* is = st.in(invstd);
    const kernel_trace::Timed timed("cuDNN batch norm backward", ops_name(p));
    CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
        handle_, kMode, ops(p), &one, &zero, &one, &param_beta, x_desc_, x, y_desc, p.relu ? y : nullptr,
        x_desc_, dy, dz_desc, p.add ? dz : nullptr, x_desc_, dx, bn_desc_, g, b, dg, db, eps, m, is,
        activation(p), ws, ws_bytes, reserve, reserve_size));
    st.write_back();
    kernel_trace::count_library_call();
  }

 private:
  static constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

  // cuDNN's channels-last kernels read and write the per-channel arrays 16 bytes at a
  // time. The model's arrays lie in its flat buffers at a float's offset: a layer's
  // running statistics follow the layer before's num_batches_tracked, so all but the
  // first batch norm's are misaligned (on an H200, cudaErrorMisalignedAddress;
  // compute-sanitizer named batchnorm_fwtr_nhwc_semiPersist's 16-byte read). Such an
  // array is copied to an aligned slot of a staging block for the call, and those the
  // call writes are copied back after it (write_back): stream-ordered copies, which a
  // captured step holds.
  static constexpr std::uintptr_t kAlign = 16;    // what the kernels' loads need
  static constexpr std::size_t kSlotAlign = 256;  // each slot's start, as cudaMalloc's
  static constexpr int kSlots = 6;
  class Staging {
   public:
    Staging(CudnnBatchNorm& owner, std::int64_t channels)
        : owner_(owner), bytes_(std::size_t(channels) * sizeof(float)) {}
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    const float* in(const float* a) { return stage(const_cast<float*>(a), true, false); }
    float* in_out(float* a) { return stage(a, true, true); }
    float* out(float* a) { return stage(a, false, true); }
    // After the call: the staged arrays it wrote, copied back to where they live.
    void write_back() {
      for (int i = 0; i < used_; ++i)
        if (back_[i])
          CUDA_CHECK(cudaMemcpyAsync(back_[i], slot(i), bytes_, cudaMemcpyDeviceToDevice, owner_.stream_));
    }

   private:
    float* stage(float* a, bool copy_in, bool copy_back) {
      if (!a || reinterpret_cast<std::uintptr_t>(a) % kAlign == 0) return a;
      DDP_REQUIRE(used_ < kSlots, "cuDNN batch norm: more arrays to stage than slots");
      const int i = used_++;
      float* s = slot(i);
      if (copy_in) CUDA_CHECK(cudaMemcpyAsync(s, a, bytes_, cudaMemcpyDeviceToDevice, owner_.stream_));
      back_[i] = copy_back ? a : nullptr;
      return s;
    }
    std::size_t stride() const { return (bytes_ + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }
    float* slot(int i) {
      return reinterpret_cast<float*>(static_cast<char*>(owner_.staging(kSlots * stride())) + i * stride());
    }
    CudnnBatchNorm& owner_;
    std::size_t bytes_;
    int used_ = 0;
    float* back_[kSlots] = {};
  };

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

  // A device block grown only, stream-ordered: the workspace, and the staging block
  // (Staging).
  struct Block {
    void* at = nullptr;
    std::size_t bytes = 0;
  };
  void* grow(Block& b, std::size_t bytes, const char* what) {
    if (bytes > b.bytes) {
      if (b.at) {
        CUDA_CHECK(cudaFreeAsync(b.at, stream_));
        // a captured step graph may point at the old block
        device_block_freed(std::string(what) + " (" + std::to_string(b.bytes) + " bytes, growing to " +
                           std::to_string(bytes) + ")");
      }
      CUDA_CHECK(cudaMallocAsync(&b.at, bytes, stream_));
      b.bytes = bytes;
    }
    return b.at;
  }
  void* workspace(std::size_t bytes) { return grow(workspace_, bytes, "cuDNN's batch-norm workspace"); }
  void* staging(std::size_t bytes) { return grow(staging_, bytes, "cuDNN's batch-norm staging block"); }

  cudaStream_t stream_;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t x_desc_ = nullptr, bn_desc_ = nullptr;
  cudnnActivationDescriptor_t relu_ = nullptr;
  Block workspace_, staging_;
};

}  // namespace

std::unique_ptr<BatchNormKernels> make_cudnn_batch_norm(cudaStream_t stream) {
  return std::make_unique<CudnnBatchNorm>(stream);
}

}  // namespace ddp::cuda
