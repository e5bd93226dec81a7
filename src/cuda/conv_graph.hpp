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
  // Returns false, having run nothing, where no engine cuDNN offers passes the rules
  // and finalizes (or the chosen plan failed its first run): the caller runs the
  // convolution another way. `label` and `detail` name the call in a timed count.
  bool run(ConvDirection d, const ConvShape& s, const void* a, const void* b, void* out, float alpha,
           float beta, const char* label, const std::string& detail);

  // fp32 on TF32 tensor cores or not (CudnnConv::set_tf32); the plans are chosen again.
  void set_tf32(bool on);

  std::size_t plans() const;     // convolutions with a graph-API plan
  std::size_t declined() const;  // convolutions run() declined

  struct Plan;  // conv_graph.cpp

 private:
  // direction, shape, alpha, beta, and the X, W and Y operands' alignments
  using Key = std::tuple<int, decltype(ConvShape().key()), float, float, int, int, int>;
  Plan* plan(ConvDirection d, const ConvShape& s, const void* a, const void* b, void* out, float alpha,
             float beta);

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
};

}  // namespace ddp::cuda
