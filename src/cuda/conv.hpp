#pragma once
// cuDNN 2-D convolution, NCHW or channels-last (NHWC; filters KRSC), on device
// pointers: forward, backward-data and backward-filter. The algorithm for each shape and direction is chosen
// once and cached; one workspace, grown only, serves all calls (stream-ordered allocation, so growing it does
// not synchronise the host).

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "cuda/dtype.hpp"

namespace ddp::cuda {

class CudnnGraphConv;

struct ConvShape {
  int n = 1, c = 1, h = 1, w = 1;  // input  (N, C, H, W)
  int k = 1, r = 1, s = 1;         // filter (K, C, R, S)
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int out_h() const { return (h + 2 * pad_h - dilation_h * (r - 1) - 1) / stride_h + 1; }
  int out_w() const { return (w + 2 * pad_w - dilation_w * (s - 1) - 1) / stride_w + 1; }
  auto key() const {
    return std::make_tuple(n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w);
  }
};

// Whether the environment switch `name` (DDP_CUDNN_LOG, DDP_CUDNN_BENCHMARK,
// DDP_CUDNN_NARROW, DDP_CUDNN_DETERMINISTIC) is on: "0" off, any other value on,
// `unset` where it is unset or empty.
bool env_flag(const char* name, bool unset = false);

class CudnnConv {
 public:
  // Heuristic: cudnnGet*_v7's first choice (fast, no trial runs). Benchmark: each
  // algorithm cudnnGet*_v7 lists run on the shape and timed on the stream (a warm-up
  // and three rounds, by the median; conv.cpp, time_each).
  enum class Search { Heuristic, Benchmark };

  // Tensors of type `dtype`, accumulation in fp32; x, y and their gradients NHWC
  // and the filter (K, R, S, C) where nhwc (cuDNN's tensor-core layout for bf16 and
  // fp16), else NCHW and (K, C, R, S).
  // deterministic = false (DDP_CUDNN_DETERMINISTIC=0): nondeterministic algorithms
  // may be chosen too (conv_search.hpp, best).
  // graph_api (DDP_CUDNN_GRAPH=1): each convolution through cuDNN's graph API
  // (conv_graph.hpp) where it has an engine the rules allow, else as before;
  // heuristics_b (DDP_CUDNN_HEURISTICS=B) its heuristics' mode B instead of INSTANT.
  CudnnConv(cudaStream_t stream, DType dtype = DType::F32, Search search = Search::Heuristic,
            bool nhwc = false, bool deterministic = true, bool graph_api = false, bool heuristics_b = false);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // y (N, K, P, Q) = alpha * conv(x (N, C, H, W), w (K, C, R, S)) + beta * y, each
  // in the layout above
  void forward(const ConvShape& s, const void* x, const void* w, void* y, float alpha = 1, float beta = 0);
  // dx (N, C, H, W) = alpha * conv^T(dy (N, K, P, Q), w) + beta * dx
  void backward_data(const ConvShape& s, const void* w, const void* dy, void* dx, float alpha = 1,
                     float beta = 0);
  // dw (K, C, R, S) = alpha * corr(x, dy) + beta * dw  (beta = 1 accumulates)
  void backward_filter(const ConvShape& s, const void* x, const void* dy, void* dw, float alpha = 1,
                       float beta = 0);

  // y = conv(relu(x * scale + bias), w) (scale null: conv(x, w)) and the per-channel
  // sums of y and y^2 (K each, fp32) in one cuDNN graph (CudnnGraphConv::forward_stats):
  // false, having run nothing, without the graph API (graph_api), in fp32 or NCHW, or
  // where cuDNN has no engine for it. scale, bias (C) fp32.
  bool forward_stats(const ConvShape& s, const void* x, const void* w, void* y, const float* scale,
                     const float* bias, float* sum, float* sqsum);
  // dw (K, C, R, S) = corr(relu(x * scale + bias), dy), the rectified input never
  // stored, in one cuDNN graph (CudnnGraphConv::backward_filter_after): false, having
  // run nothing, where forward_stats would be, or where cuDNN has no engine for it.
  bool backward_filter_after(const ConvShape& s, const void* x, const void* dy, void* dw, const float* scale,
                             const float* bias);
  // dx (N, C, H, W) = conv^T(dy, w) where a * scale + bias > 0, else 0, and the sums of
  // dx and of dx (a - mean) over (N, H, W) (C each, fp32), in one cuDNN graph
  // (CudnnGraphConv::backward_data_sums): false, having run nothing, where forward_stats
  // would be, or where cuDNN has no engine for it. a as x; scale, bias, mean (C) fp32.
  bool backward_data_sums(const ConvShape& s, const void* w, const void* dy, void* dx, const void* a,
                          const float* scale, const float* bias, const float* mean, float* sum,
                          float* centred_sum);

  std::size_t workspace_bytes() const { return workspace_bytes_; }
  // fp32 on TF32 tensor cores (train.tf32: cuDNN's default math on fp32, which takes
  // them on Ampere and newer) or not (FMA math, the default). The algorithms are
  // chosen again for it.
  void set_tf32(bool on);

  // The graph API's count of convolutions (shape, direction, alpha/beta, alignment)
  // with a plan of its own, and of those it left to the legacy API; 0 and 0 without it.
  std::size_t graph_plans() const;
  std::size_t graph_declined() const;
  std::string graph_declined_reason() const;  // the last declined graph's shape and why

 private:
  struct Plan {
    cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
    std::size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  };
  const Plan& plan(const ConvShape& s);  // sets the descriptors to s; chooses on first sight
  void* workspace(std::size_t bytes);

  cudaStream_t stream_;
  DType dtype_;
  Search search_;
  bool nhwc_;
  bool deterministic_;
  bool tf32_ = false;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  std::map<decltype(ConvShape().key()), Plan> plans_;
  std::unique_ptr<CudnnGraphConv> graph_;  // graph_api
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace ddp::cuda
