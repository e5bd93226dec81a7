#pragma once
// The convolutions through cuDNN's graph API (the backend API of cudnn_graph.h, the
// one PyTorch reaches through cudnn-frontend): per shape, direction, alpha/beta and
// operand alignment, an operation graph of one convolution, the engine
// configurations cuDNN's heuristics rank (mode INSTANT, or B) followed by its
// fallback list, the first that our rules allow (conv_search.hpp, engine_allowed)
// and that finalizes into an execution plan; or, in the timed search, the fastest of
// them on the shape. The legacy API (cudnnConvolutionForward and its _v7 choices)
// reaches only the engines that map to its eight algorithms; the graph API reaches
// all, which is how PyTorch's convolutions come to cost less at the same shapes.
//
// The backend API rather than cudnn-frontend: it ships in cuDNN itself (no pinned
// header library to fetch beside CUDA), and a convolution alone needs a dozen
// descriptors, held here by Desc.
//
// Chosen by DDP_CUDNN_GRAPH=1 (cuda_backend.cpp); CudnnConv calls run() and takes its
// legacy path for a convolution run() declines.

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/conv.hpp"
#include "cuda/dtype.hpp"

namespace ddp::cuda {

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

class CudnnGraphConv {
 public:
  // The workspace a plan runs with: bytes long at least, stream-ordered (CudnnConv's,
  // shared with its legacy path).
  using Workspace = std::function<void*(std::size_t bytes)>;

  // handle: bound to `stream` already. dtype, nhwc, deterministic: as CudnnConv's.
  // timed: the timed search (DDP_CUDNN_BENCHMARK=1) over the allowed plans; else the
  // heuristics' first. mode_b: cuDNN's heuristics mode B (DDP_CUDNN_HEURISTICS=B),
  // else INSTANT, PyTorch's default.
  CudnnGraphConv(cudnnHandle_t handle, cudaStream_t stream, DType dtype, bool nhwc, bool deterministic,
                 bool timed, bool mode_b, Workspace workspace);
  ~CudnnGraphConv();
  CudnnGraphConv(const CudnnGraphConv&) = delete;
  CudnnGraphConv& operator=(const CudnnGraphConv&) = delete;

  // The convolution of direction d on shape s, in CudnnConv's layouts:
  //   Forward:        out y  = alpha * conv(a = x, b = w) + beta * y
  //   BackwardData:   out dx = alpha * conv^T(a = w, b = dy) + beta * dx
  //   BackwardFilter: out dw = alpha * corr(a = x, b = dy) + beta * dw
  // Returns false where no engine cuDNN offers passes the rules and finalizes (having
  // run nothing), or where the chosen plan failed its first run with beta 0 (what it
  // may have written is written again): the caller runs the convolution another way.
  // A first run that fails with beta != 0 (its output may hold part of a sum) ends the
  // job with one line naming the convolution and DDP_CUDNN_GRAPH=0. `label` and
  // `detail` name the call in a timed count.
  bool run(ConvDirection d, const ConvShape& s, const void* a, const void* b, void* out, float alpha,
           float beta, const char* label, const std::string& detail);

  // The forward with batch norm's statistics in one cuDNN graph (bf16/fp16 channels-last;
  // elsewhere false at once):
  //   y = conv(relu(x * scale + bias), w)   where scale (C) and bias (C) are given (the
  //                                         batch norm before it applied, with its relu,
  //                                         on the way in: fp32, never stored),
  //   y = conv(x, w)                        where scale is null;
  //   sum (K) and sqsum (K): the sums of y and of y^2 over (N, P, Q), fp32 (what the
  //   batch norm after it needs), written.
  // The fusions of cuDNN's samples ("scale-bias-relu -> conv -> genstats"), scale and bias
  // in fp32, or in fp16 narrowed to it where cuDNN has an engine for that alone. False
  // where cuDNN offers no allowed engine for the graph, while the step is captured
  // before its plan is made, or given a scale without a bias (the caller then runs the
  // convolution and its statistics apart).
  bool forward_stats(const ConvShape& s, const void* x, const void* w, void* y, const float* scale,
                     const float* bias, float* sum, float* sqsum, const char* label,
                     const std::string& detail);

  // The backward filter of forward_stats's first form, from the same x, scale and bias
  // (bf16/fp16 channels-last; elsewhere false at once):
  //   dw = corr(relu(x * scale + bias), dy)
  // the rectified input never stored (cudnn-frontend's "scale-bias-relu -> wgrad"), scale
  // and bias in fp32 or (fp16) narrowed as there. False where cuDNN offers no allowed engine,
  // while the step is captured before its plan is made, or without scale and bias.
  bool backward_filter_after(const ConvShape& s, const void* x, const void* dy, void* dw, const float* scale,
                             const float* bias, const char* label, const std::string& detail);

  // The backward data of a convolution whose input was relu(a * scale + bias) (forward_stats's
  // first form), taken back through that relu, with the sums the batch norm before it needs
  // (bf16/fp16 channels-last; elsewhere false at once):
  //   dx = conv^T(w, dy) where a * scale + bias > 0, else 0    (written, I/O type)
  //   sum (C) = the sum of dx over (N, H, W), centred_sum (C) = that of dx (a - mean), fp32,
  //   of dx's fp32 values before it is rounded to the I/O type (or, where cuDNN takes
  //   only that form of the graph, of dx as written: possibly rounded)
  // in one cuDNN graph: the generic runtime fusion's backward data with an epilogue of
  // element-wise operations and two sums (cuDNN's "dgrad -> drelu -> dbn", which its
  // DgradDreluBNBwdWeight engine has for fp16 alone). a, the batch norm's input, in the
  // I/O type; scale, bias, mean (C) fp32. False where cuDNN offers no allowed engine (a
  // strided convolution's, for one: sm_90's fusions have none), or while the step is
  // captured before its plan is made.
  bool backward_data_sums(const ConvShape& s, const void* w, const void* dy, void* dx, const void* a,
                          const float* scale, const float* bias, const float* mean, float* sum,
                          float* centred_sum, const char* label, const std::string& detail);

  // fp32 on TF32 tensor cores or not (CudnnConv::set_tf32); the plans are chosen again.
  void set_tf32(bool on);

  std::size_t plans() const;     // graphs (convolutions, fused forwards) with a plan
  std::size_t declined() const;  // graphs declined: no engine taken for them
  // Why the last graph declined was (its shape, and the engines passed over by reason).
  const std::string& declined_reason() const { return declined_reason_; }

  struct Plan;  // conv_graph.cpp

 private:
  // Stats: a forward's statistics; Prologue: x rectified from x scale + bias on the way
  // in (a forward's or a backward filter's); Narrow...: scale and bias in the I/O type,
  // else fp32; DreluSums: a backward data's epilogue (backward_data_sums), its sums of the
  // fp32 gradient, or of the gradient as written (DreluSumsOfWritten, its second form).
  enum class Fusion {
    None,
    Stats,
    PrologueAndStats,
    NarrowPrologueAndStats,
    Prologue,
    NarrowPrologue,
    DreluSums,
    DreluSumsOfWritten
  };
  // scale and bias narrowed to the I/O type (C each, one after the other) in a buffer of
  // this object's; null while the step is captured and the buffer would have to grow.
  const void* narrowed(const float* scale, const float* bias, int C);
  // direction, shape, alpha, beta, the X, W and Y operands' alignments, the fusion, the
  // per-channel arrays' alignment and the batch norm input's (DreluSums; else 16)
  using Key = std::tuple<int, decltype(ConvShape().key()), float, float, int, int, int, int, int, int>;
  // operands: X, W, Y, then (a fusion's) scale, bias, sum, sum of squares; DreluSums's by
  // unique id (conv_graph.cpp), a and mean at 12 and 13
  Plan* plan(ConvDirection d, const ConvShape& s, const std::vector<const void*>& operands, float alpha,
             float beta, Fusion fusion);
  bool execute(ConvDirection d, const ConvShape& s, const std::vector<const void*>& operands, float alpha,
               float beta, Fusion fusion, const char* label, const std::string& detail);

  cudnnHandle_t handle_;
  cudaStream_t stream_;
  DType dtype_;
  bool nhwc_;
  bool deterministic_;
  bool timed_;
  bool mode_b_;
  bool tf32_ = false;
  Workspace workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // null: declined
  std::string declined_reason_;
  void* channel_ = nullptr;  // scale and bias narrowed (NarrowPrologueAndStats), grown only
  std::size_t channel_bytes_ = 0;
};

}  // namespace ddp::cuda
