#include "cuda/conv.hpp"

#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

namespace {
// The first result cuDNN ranks best that ran (Find) or is supported (Get).
template <class Perf>
const Perf& best(const Perf* perf, int count, const char* what) {
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) return perf[i];
  DDP_FATAL("cuDNN offers no " << what << " algorithm for this shape");
}
constexpr int kMaxAlgos = 16;
}  // namespace

CudnnConv::CudnnConv(cudaStream_t stream, DType dtype, Search search)
    : stream_(stream), dtype_(dtype), search_(search) {
  CUDNN_CHECK(cudnnCreate(&handle_));
  CUDNN_CHECK(cudnnSetStream(handle_, stream_));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc_));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc_));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_desc_));
}

CudnnConv::~CudnnConv() {
  if (workspace_) cudaFreeAsync(workspace_, stream_);
  cudnnDestroyConvolutionDescriptor(conv_desc_);
  cudnnDestroyFilterDescriptor(w_desc_);
  cudnnDestroyTensorDescriptor(y_desc_);
  cudnnDestroyTensorDescriptor(x_desc_);
  cudnnDestroy(handle_);
}

void* CudnnConv::workspace(std::size_t bytes) {
  if (bytes > workspace_bytes_) {
    // Stream-ordered: the old block is freed after the work already queued on it.
    if (workspace_) CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
    CUDA_CHECK(cudaMallocAsync(&workspace_, bytes, stream_));
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

const CudnnConv::Plan& CudnnConv::plan(const ConvShape& s) {
  cudnnDataType_t t = cudnn_type(dtype_);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_, CUDNN_TENSOR_NCHW, t, s.n, s.c, s.h, s.w));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc_, t, CUDNN_TENSOR_NCHW, s.k, s.c, s.r, s.s));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_, s.pad_h, s.pad_w, s.stride_h, s.stride_w,
                                              s.dilation_h, s.dilation_w, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  // fp32 stays fp32 (no TF32), so the GPU agrees with the CPU path to fp32 rounding;
  // bf16/fp16 use tensor cores.
  CUDNN_CHECK(
      cudnnSetConvolutionMathType(conv_desc_, dtype_ == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, c = 0, p = 0, q = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_, x_desc_, w_desc_, &n, &c, &p, &q));
  DDP_REQUIRE(n == s.n && c == s.k && p == s.out_h() && q == s.out_w(), "cuDNN output shape disagrees");
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc_, CUDNN_TENSOR_NCHW, t, n, c, p, q));

  auto found = plans_.find(s.key());
  if (found != plans_.end()) return found->second;

  Plan pl;
  int count = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxAlgos];
  cudnnConvolutionBwdDataAlgoPerf_t bwd_data[kMaxAlgos];
  cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[kMaxAlgos];
  if (search_ == Search::Benchmark) {
    CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(handle_, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                     kMaxAlgos, &count, fwd));
    pl.fwd = best(fwd, count, "forward").algo;
    CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle_, w_desc_, y_desc_, conv_desc_, x_desc_,
                                                          kMaxAlgos, &count, bwd_data));
    pl.bwd_data = best(bwd_data, count, "backward-data").algo;
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle_, x_desc_, y_desc_, conv_desc_, w_desc_,
                                                            kMaxAlgos, &count, bwd_filter));
    pl.bwd_filter = best(bwd_filter, count, "backward-filter").algo;
  } else {
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle_, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                       kMaxAlgos, &count, fwd));
    pl.fwd = best(fwd, count, "forward").algo;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, w_desc_, y_desc_, conv_desc_, x_desc_,
                                                            kMaxAlgos, &count, bwd_data));
    pl.bwd_data = best(bwd_data, count, "backward-data").algo;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, x_desc_, y_desc_, conv_desc_, w_desc_,
                                                              kMaxAlgos, &count, bwd_filter));
    pl.bwd_filter = best(bwd_filter, count, "backward-filter").algo;
  }
  CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle_, x_desc_, w_desc_, conv_desc_, y_desc_, pl.fwd,
                                                      &pl.fwd_bytes));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, w_desc_, y_desc_, conv_desc_, x_desc_,
                                                           pl.bwd_data, &pl.bwd_data_bytes));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle_, x_desc_, y_desc_, conv_desc_, w_desc_,
                                                             pl.bwd_filter, &pl.bwd_filter_bytes));
  return plans_.emplace(s.key(), pl).first->second;
}

void CudnnConv::forward(const ConvShape& s, const void* x, const void* w, void* y, float alpha, float beta) {
  const Plan& p = plan(s);
  void* ws = workspace(p.fwd_bytes);
  CUDNN_CHECK(cudnnConvolutionForward(handle_, &alpha, x_desc_, x, w_desc_, w, conv_desc_, p.fwd, ws,
                                      p.fwd_bytes, &beta, y_desc_, y));
}

void CudnnConv::backward_data(const ConvShape& s, const void* w, const void* dy, void* dx, float alpha,
                              float beta) {
  const Plan& p = plan(s);
  void* ws = workspace(p.bwd_data_bytes);
  CUDNN_CHECK(cudnnConvolutionBackwardData(handle_, &alpha, w_desc_, w, y_desc_, dy, conv_desc_, p.bwd_data,
                                           ws, p.bwd_data_bytes, &beta, x_desc_, dx));
}

void CudnnConv::backward_filter(const ConvShape& s, const void* x, const void* dy, void* dw, float alpha,
                                float beta) {
  const Plan& p = plan(s);
  void* ws = workspace(p.bwd_filter_bytes);
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle_, &alpha, x_desc_, x, y_desc_, dy, conv_desc_,
                                             p.bwd_filter, ws, p.bwd_filter_bytes, &beta, w_desc_, dw));
}

}  // namespace ddp::cuda
