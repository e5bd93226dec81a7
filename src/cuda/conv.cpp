#include "cuda/conv.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/conv_graph.hpp"
#include "cuda/conv_search.hpp"
#include "cuda/cuda_check.hpp"
#include "model/backend.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {
// DDP_CUDNN_LOG=1: one line per shape with the algorithms chosen (and, in a timed
// search, their times).
bool log_choices() {
  static const bool on = env_flag("DDP_CUDNN_LOG");
  return on;
}

// A timed count's word on a call: the type, and while a count runs the shape too
// ("bf16 N256 C64 56x56 K64 3x3/1"), so that the step's split gives each shape's time
// on the device beside the timed search's (DDP_CUDNN_LOG) and the floor's.
std::string call_detail(const ConvShape& s, DType t) {
  if (!kernel_trace::counting()) return dtype_name(t);
  char text[96];
  std::snprintf(text, sizeof text, "%s N%d C%d %dx%d K%d %dx%d/%d", dtype_name(t), s.n, s.c, s.h, s.w, s.k,
                s.r, s.s, s.stride_h);
  return text;
}

// The timed search's own clock. Each algorithm cuDNN lists as supported for the shape
// (cudnnGet*_v7) runs twice back to back between two events on the stream, with its
// own workspace, as the step will call it; its perf's time is the mean of the two (ms).
// One whose workspace cannot be had or that fails to run is marked not supported.
// cuDNN's own timed search (cudnnFind*) is not used: on an H200 (cuDNN 9.19, bf16
// channels-last, ResNet-50 at 256) it ranked the 1x1 convolutions' forward algorithm 0
// first at 1.3 ms, where the heuristics' algorithm 1 ran the same call in 0.06 ms,
// and gave the backward-data algorithms 53 to 150 ms: with its choices the step ran
// at 2,845 samples/s, with the heuristics' at 5,082 (docs/performance.md).
template <class Perf, class Bytes, class Run>
void time_each(cudaStream_t stream, Perf* perf, int count, Bytes workspace_size, Run run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < count; ++i) {
    Perf& p = perf[i];
    p.time = -1;
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    std::size_t bytes = 0;
    p.status = workspace_size(p.algo, &bytes);
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    void* ws = nullptr;
    if (bytes && cudaMallocAsync(&ws, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // too large for the memory left: not a candidate
      p.status = CUDNN_STATUS_NOT_SUPPORTED;
      continue;
    }
    CUDA_CHECK(cudaEventRecord(start, stream));
    p.status = run(p.algo, ws, bytes);
    if (p.status == CUDNN_STATUS_SUCCESS) p.status = run(p.algo, ws, bytes);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    if (ws) CUDA_CHECK(cudaFreeAsync(ws, stream));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    p.time = ms / 2;
    p.memory = bytes;
  }
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaEventDestroy(start));
}

// Operands of a shape for the timed search (x, w, y; their gradients share them),
// zeroed, stream-ordered, freed with the search.
struct SearchOperands {
  SearchOperands(const ConvShape& s, DType t, cudaStream_t stream) : stream_(stream) {
    const std::size_t e = dtype_size(t);
    alloc(&x, e * s.n * s.c * s.h * s.w);
    alloc(&w, e * s.k * s.c * s.r * s.s);
    alloc(&y, e * s.n * s.k * s.out_h() * s.out_w());
  }
  ~SearchOperands() {
    for (void* p : {x, w, y})
      if (p) cudaFreeAsync(p, stream_);
  }
  SearchOperands(const SearchOperands&) = delete;
  SearchOperands& operator=(const SearchOperands&) = delete;
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;

 private:
  void alloc(void** p, std::size_t bytes) {
    CUDA_CHECK(cudaMallocAsync(p, bytes, stream_));
    CUDA_CHECK(cudaMemsetAsync(*p, 0, bytes, stream_));
  }
  cudaStream_t stream_;
};
}  // namespace

bool env_flag(const char* name, bool unset) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) != "0" : unset;
}

CudnnConv::CudnnConv(cudaStream_t stream, DType dtype, Search search, bool nhwc, bool deterministic,
                     bool graph_api, bool heuristics_b)
    : stream_(stream), dtype_(dtype), search_(search), nhwc_(nhwc), deterministic_(deterministic) {
  CUDNN_CHECK(cudnnCreate(&handle_));
  CUDNN_CHECK(cudnnSetStream(handle_, stream_));
  if (graph_api)
    graph_ = std::make_unique<CudnnGraphConv>(handle_, stream_, dtype_, nhwc_, deterministic_,
                                              search_ == Search::Benchmark, heuristics_b,
                                              [this](std::size_t bytes) { return workspace(bytes); });
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc_));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc_));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_desc_));
}

CudnnConv::~CudnnConv() {
  graph_.reset();  // its descriptors name the handle
  if (workspace_) cudaFreeAsync(workspace_, stream_);
  cudnnDestroyConvolutionDescriptor(conv_desc_);
  cudnnDestroyFilterDescriptor(w_desc_);
  cudnnDestroyTensorDescriptor(y_desc_);
  cudnnDestroyTensorDescriptor(x_desc_);
  cudnnDestroy(handle_);
}

void CudnnConv::set_tf32(bool on) {
  if (on == tf32_) return;
  tf32_ = on;
  plans_.clear();  // chosen under the other math
  if (graph_) graph_->set_tf32(on);
}

std::size_t CudnnConv::graph_plans() const { return graph_ ? graph_->plans() : 0; }
std::size_t CudnnConv::graph_declined() const { return graph_ ? graph_->declined() : 0; }
std::string CudnnConv::graph_declined_reason() const { return graph_ ? graph_->declined_reason() : ""; }

void* CudnnConv::workspace(std::size_t bytes) {
  if (bytes > workspace_bytes_) {
    // Stream-ordered: the old block is freed after the work already queued on it.
    if (workspace_) {
      CUDA_CHECK(cudaFreeAsync(workspace_, stream_));
      // a captured step graph may point at the old block
      device_block_freed("the cuDNN workspace (" + std::to_string(workspace_bytes_) + " bytes, growing to " +
                         std::to_string(bytes) + ")");
    }
    CUDA_CHECK(cudaMallocAsync(&workspace_, bytes, stream_));
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

const CudnnConv::Plan& CudnnConv::plan(const ConvShape& s) {
  const cudnnDataType_t t = cudnn_type(dtype_);
  const cudnnTensorFormat_t format = nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_, format, t, s.n, s.c, s.h, s.w));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc_, t, format, s.k, s.c, s.r, s.s));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_, s.pad_h, s.pad_w, s.stride_h, s.stride_w,
                                              s.dilation_h, s.dilation_w, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  // fp32 stays fp32 (no TF32) unless set_tf32, so the GPU agrees with the CPU path to
  // fp32 rounding; bf16/fp16 use tensor cores.
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, dtype_ != DType::F32 ? CUDNN_TENSOR_OP_MATH
                                                      : tf32_              ? CUDNN_DEFAULT_MATH
                                                                           : CUDNN_FMA_MATH));
  int n = 0, c = 0, p = 0, q = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_, x_desc_, w_desc_, &n, &c, &p, &q));
  DDP_REQUIRE(n == s.n && c == s.k && p == s.out_h() && q == s.out_w(), "cuDNN output shape disagrees");
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc_, format, t, n, c, p, q));

  auto found = plans_.find(s.key());
  if (found != plans_.end()) return found->second;

  Plan pl;
  int count = 0;
  std::string fwd_times, bwd_data_times, bwd_filter_times;  // the log's word on each choice
  const bool narrow = dtype_ != DType::F32;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxAlgos];
  cudnnConvolutionBwdDataAlgoPerf_t bwd_data[kMaxAlgos];
  cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[kMaxAlgos];
  // A shape first met while the step is captured (none should be: warm-up steps run
  // uncaptured) takes the heuristics' choice: the timed search waits on the host.
  if (search_ == Search::Benchmark && !capturing(stream_)) {
    const SearchOperands o(s, dtype_, stream_);
    const float one = 1.0f, zero = 0.0f;
    pl.fwd = timed_choice<cudnnConvolutionFwdAlgoPerf_t>(
        [&](auto* perf, int* n) {
          CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle_, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                             kMaxAlgos, n, perf));
          time_each(
              stream_, perf, *n,
              [&](auto algo, std::size_t* bytes) {
                return cudnnGetConvolutionForwardWorkspaceSize(handle_, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                               algo, bytes);
              },
              [&](auto algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionForward(handle_, &one, x_desc_, o.x, w_desc_, o.w, conv_desc_, algo,
                                               ws, bytes, &zero, y_desc_, o.y);
              });
        },
        "forward", narrow, deterministic_, &fwd_times);
    pl.bwd_data = timed_choice<cudnnConvolutionBwdDataAlgoPerf_t>(
        [&](auto* perf, int* n) {
          CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, w_desc_, y_desc_, conv_desc_,
                                                                  x_desc_, kMaxAlgos, n, perf));
          time_each(
              stream_, perf, *n,
              [&](auto algo, std::size_t* bytes) {
                return cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, w_desc_, y_desc_, conv_desc_,
                                                                    x_desc_, algo, bytes);
              },
              [&](auto algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionBackwardData(handle_, &one, w_desc_, o.w, y_desc_, o.y, conv_desc_,
                                                    algo, ws, bytes, &zero, x_desc_, o.x);
              });
        },
        "backward-data", narrow, deterministic_, &bwd_data_times);
    pl.bwd_filter = timed_choice<cudnnConvolutionBwdFilterAlgoPerf_t>(
        [&](auto* perf, int* n) {
          CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, x_desc_, y_desc_, conv_desc_,
                                                                    w_desc_, kMaxAlgos, n, perf));
          time_each(
              stream_, perf, *n,
              [&](auto algo, std::size_t* bytes) {
                return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle_, x_desc_, y_desc_, conv_desc_,
                                                                      w_desc_, algo, bytes);
              },
              [&](auto algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionBackwardFilter(handle_, &one, x_desc_, o.x, y_desc_, o.y, conv_desc_,
                                                      algo, ws, bytes, &zero, w_desc_, o.w);
              });
        },
        "backward-filter", narrow, deterministic_, &bwd_filter_times);
  } else {
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle_, x_desc_, w_desc_, conv_desc_, y_desc_,
                                                       kMaxAlgos, &count, fwd));
    const auto& f = best(fwd, count, "forward", narrow, deterministic_);
    pl.fwd = f.algo;
    fwd_times = determinism_word(f);
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, w_desc_, y_desc_, conv_desc_, x_desc_,
                                                            kMaxAlgos, &count, bwd_data));
    const auto& bd = best(bwd_data, count, "backward-data", narrow, deterministic_);
    pl.bwd_data = bd.algo;
    bwd_data_times = determinism_word(bd);
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, x_desc_, y_desc_, conv_desc_, w_desc_,
                                                              kMaxAlgos, &count, bwd_filter));
    const auto& bf = best(bwd_filter, count, "backward-filter", narrow, deterministic_);
    pl.bwd_filter = bf.algo;
    bwd_filter_times = determinism_word(bf);
  }
  CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle_, x_desc_, w_desc_, conv_desc_, y_desc_, pl.fwd,
                                                      &pl.fwd_bytes));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, w_desc_, y_desc_, conv_desc_, x_desc_,
                                                           pl.bwd_data, &pl.bwd_data_bytes));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle_, x_desc_, y_desc_, conv_desc_, w_desc_,
                                                             pl.bwd_filter, &pl.bwd_filter_bytes));
  if (log_choices())
    std::fprintf(
        stderr,
        "cuDNN %s %s conv N%d C%d H%d W%d K%d R%d S%d pad %d stride %d: fwd algo %d (%zu B%s), bwd-data algo "
        "%d (%zu B%s), bwd-filter algo %d (%zu B%s)\n",
        dtype_name(dtype_), nhwc_ ? "nhwc" : "nchw", s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.pad_h, s.stride_h,
        int(pl.fwd), pl.fwd_bytes, fwd_times.c_str(), int(pl.bwd_data), pl.bwd_data_bytes,
        bwd_data_times.c_str(), int(pl.bwd_filter), pl.bwd_filter_bytes, bwd_filter_times.c_str());
  return plans_.emplace(s.key(), pl).first->second;
}

void CudnnConv::forward(const ConvShape& s, const void* x, const void* w, void* y, float alpha, float beta) {
  if (graph_ && graph_->run(ConvDirection::Forward, s, x, w, y, alpha, beta, "cuDNN conv forward",
                            call_detail(s, dtype_)))
    return;
  const Plan& p = plan(s);
  void* ws = workspace(p.fwd_bytes);
  const kernel_trace::Timed timed("cuDNN conv forward", call_detail(s, dtype_).c_str());
  CUDNN_CHECK(cudnnConvolutionForward(handle_, &alpha, x_desc_, x, w_desc_, w, conv_desc_, p.fwd, ws,
                                      p.fwd_bytes, &beta, y_desc_, y));
}

bool CudnnConv::forward_stats(const ConvShape& s, const void* x, const void* w, void* y, const float* scale,
                              const float* bias, float* sum, float* sqsum) {
  return graph_ && graph_->forward_stats(s, x, w, y, scale, bias, sum, sqsum,
                                         "cuDNN conv forward with statistics", call_detail(s, dtype_));
}

bool CudnnConv::backward_filter_after(const ConvShape& s, const void* x, const void* dy, void* dw,
                                      const float* scale, const float* bias) {
  return graph_ && graph_->backward_filter_after(s, x, dy, dw, scale, bias,
                                                 "cuDNN conv backward filter after scale-bias-relu",
                                                 call_detail(s, dtype_));
}

bool CudnnConv::backward_data_sums(const ConvShape& s, const void* w, const void* dy, void* dx, const void* a,
                                   const float* scale, const float* bias, const float* mean, float* sum,
                                   float* centred_sum) {
  return graph_ && graph_->backward_data_sums(s, w, dy, dx, a, scale, bias, mean, sum, centred_sum,
                                              "cuDNN conv backward data with scale-bias-relu's backward sums",
                                              call_detail(s, dtype_));
}

void CudnnConv::backward_data(const ConvShape& s, const void* w, const void* dy, void* dx, float alpha,
                              float beta) {
  if (graph_ && graph_->run(ConvDirection::BackwardData, s, w, dy, dx, alpha, beta,
                            "cuDNN conv backward data", call_detail(s, dtype_)))
    return;
  const Plan& p = plan(s);
  void* ws = workspace(p.bwd_data_bytes);
  const kernel_trace::Timed timed("cuDNN conv backward data", call_detail(s, dtype_).c_str());
  CUDNN_CHECK(cudnnConvolutionBackwardData(handle_, &alpha, w_desc_, w, y_desc_, dy, conv_desc_, p.bwd_data,
                                           ws, p.bwd_data_bytes, &beta, x_desc_, dx));
}

void CudnnConv::backward_filter(const ConvShape& s, const void* x, const void* dy, void* dw, float alpha,
                                float beta) {
  if (graph_ && graph_->run(ConvDirection::BackwardFilter, s, x, dy, dw, alpha, beta,
                            "cuDNN conv backward filter", call_detail(s, dtype_)))
    return;
  const Plan& p = plan(s);
  void* ws = workspace(p.bwd_filter_bytes);
  const kernel_trace::Timed timed("cuDNN conv backward filter", call_detail(s, dtype_).c_str());
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle_, &alpha, x_desc_, x, y_desc_, dy, conv_desc_,
                                             p.bwd_filter, ws, p.bwd_filter_bytes, &beta, w_desc_, dw));
}

}  // namespace ddp::cuda
