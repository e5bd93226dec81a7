#include "cuda/conv_graph.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <utility>

#include "cuda/conv_search.hpp"
#include "cuda/cuda_check.hpp"
#include "model/backend.hpp"  // device_block_freed
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace graph_api {

// One backend descriptor, destroyed with its holder; null where default-made.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) { CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Desc& operator=(Desc&& other) noexcept {
    if (this != &other) {
      if (d_) cudnnBackendDestroyDescriptor(d_);
      d_ = std::exchange(other.d_, nullptr);
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const void* values) {
  CUDNN_CHECK(cudnnBackendSetAttribute(d.get(), name, type, count, values));
}

void set_desc(const Desc& d, cudnnBackendAttributeName_t name, const Desc& value) {
  const cudnnBackendDescriptor_t v = value.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

void set_pair(const Desc& d, cudnnBackendAttributeName_t name, int a, int b) {
  const std::int64_t v[2] = {a, b};
  set(d, name, CUDNN_TYPE_INT64, 2, v);
}

// The tensors' unique ids in every graph: the convolution's input, filter and output
// (in backward, dx is the X tensor, dw the W tensor and dy the Y tensor); where it has
// a prologue (a forward with statistics, a backward filter), the prologue's per-channel
// scale and bias and its three virtual results (never in memory); in a forward with
// statistics, their sum and sum of squares. A backward data with the batch norm's
// relu and sums in its epilogue: X the masked gradient it writes, the scale and bias of
// the batch norm's map, the sums of X and of X (a - mean) in kSum and kSqsum, the
// convolution's own result (virtual), the batch norm's input a and mean, and the
// virtual a scale, + bias, a - mean, the masked gradient in fp32 and it times (a - mean).
constexpr std::int64_t kX = 1, kW = 2, kY = 3, kScale = 4, kBias = 5, kSum = 6, kSqsum = 7;
constexpr std::int64_t kScaled = 8, kBiased = 9, kRectified = 10;
constexpr std::int64_t kConvResult = 11, kBnInput = 12, kMean = 13, kCentred = 14, kProduct = 15,
                       kMasked = 16;

// Whether d finalized: a descriptor cuDNN refuses declines the convolution to the
// legacy path rather than ending the run.
bool finalized(const Desc& d) { return cudnnBackendFinalize(d.get()) == CUDNN_STATUS_SUCCESS; }

// A 4-D tensor given in NCHW order (as the graph API takes every layout), its strides
// NCHW or channels-last; null where cuDNN does not finalize it.
// A virtual one is an intermediate of the graph, in no memory.
Desc tensor(std::int64_t uid, DType t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
            bool nhwc, std::int64_t alignment, bool is_virtual = false) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t type = cudnn_type(t);
  if (is_virtual) {
    const bool yes = true;
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  const std::int64_t dims[4] = {n, c, h, w};
  const std::int64_t nchw[4] = {c * h * w, h * w, w, 1}, channels_last[4] = {h * w * c, 1, w * c, c};
  set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, nhwc ? channels_last : nchw);
  set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  return finalized(d) ? std::move(d) : Desc();
}

// The largest power of two up to 16 that divides the address: a plan is made for the
// alignment its operands have (cuDNN's vectorised engines want 16 bytes).
int alignment(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  int a = 16;
  while (a > 1 && u % std::uintptr_t(a)) a /= 2;
  return a;
}

const char* direction_name(ConvDirection d) {
  return d == ConvDirection::Forward ? "fwd" : d == ConvDirection::BackwardData ? "bwd-data" : "bwd-filter";
}

// The operation of each direction and its attributes' names: X, W and Y are dx, w and
// dy in backward data, x, dw and dy in backward filter.
struct OperationAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

const OperationAttributes& operation_attributes(ConvDirection d) {
  static const OperationAttributes forward{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static const OperationAttributes backward_data{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static const OperationAttributes backward_filter{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  return d == ConvDirection::Forward        ? forward
         : d == ConvDirection::BackwardData ? backward_data
                                            : backward_filter;
}

// An engine configuration that passed the rules and finalized into a plan.
struct Candidate {
  Desc config, plan;
  std::int64_t workspace = 0;
  std::int64_t engine = -1;  // cuDNN's global engine index, for the log
  std::string notes;         // its numerical notes, for the log
  float ms = -1;             // the timed search's median
};

std::string note_names(const std::vector<cudnnBackendNumericalNote_t>& notes) {
  static const char* names[] = {"tensor core",      "down-convert", "reduced-precision sum", "fft",
                                "nondeterministic", "winograd",     "winograd 4x4",          "winograd 6x6",
                                "winograd 13x13",   "strict nan"};
  std::string text;
  for (cudnnBackendNumericalNote_t n : notes) {
    if (!text.empty()) text += ", ";
    text += int(n) >= 0 && int(n) < int(sizeof names / sizeof *names) ? names[int(n)] : "?";
  }
  return text;
}

// The engine configurations cuDNN's heuristics rank for the graph in `mode`, best
// first; none where the mode has none for it. The heuristics descriptor goes into
// `keep` (the configurations are read from it).
std::vector<Desc> engine_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                 std::vector<Desc>& keep) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return {};
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                               &count, nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return {};
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               count, &got, raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  configs.resize(std::size_t(std::min(got, count)));
  keep.push_back(std::move(heur));
  return configs;
}

// Why configurations were passed over, counted for the log and for a declined graph's
// word (CudnnGraphConv::declined_reason): one that does not say its engine, one our
// rules leave out (with its notes), one that does not finalize, one whose workspace is
// too large.
struct PassedOver {
  int unreadable = 0, rules = 0, finalize = 0, workspace = 0;
  std::string notes;  // of the first the rules left out
  std::string text() const {
    char t[256];
    std::snprintf(
        t, sizeof t,
        "%d left out by the rules%s%s%s, %d not finalized, %d with too large a workspace, %d unreadable",
        rules, notes.empty() ? "" : " (the first: ", notes.c_str(), notes.empty() ? "" : ")", finalize,
        workspace, unreadable);
    return t;
  }
};

// The configuration as a candidate: its engine's notes against the rules, then a plan
// finalized for it. False where the rules leave it out, its engine is among `skip`
// (one already a candidate), it does not finalize, or its workspace exceeds
// max_workspace (more than the device has to spare: PyTorch too passes over a plan
// whose workspace cannot be had); `why` counts which.
bool make_candidate(cudnnHandle_t handle, Desc config, const EngineRules& rules,
                    const std::vector<std::int64_t>& skip, std::int64_t max_workspace, Candidate* out,
                    PassedOver* why) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &e) != CUDNN_STATUS_SUCCESS)
    return ++why->unreadable, false;
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               std::int64_t(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return ++why->unreadable, false;
  notes.resize(std::size_t(std::min<std::int64_t>(count, std::int64_t(notes.size()))));
  if (!engine_allowed(notes, rules)) {
    if (why->rules++ == 0) why->notes = note_names(notes);
    return false;
  }
  std::int64_t index = -1;
  (void)cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  if (index >= 0 && std::find(skip.begin(), skip.end(), index) != skip.end()) return false;

  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS) return ++why->finalize, false;
  std::int64_t bytes = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                               &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes < 0 || bytes > max_workspace)
    return ++why->workspace, false;
  out->config = std::move(config);
  out->plan = std::move(plan);
  out->workspace = bytes;
  out->engine = index;
  out->notes = note_names(notes);
  return true;
}

// A finalized variant pack: the operands by unique id (operands[i] is uid i + 1: X, W,
// Y, then the scale and bias where the graph has a prologue, then in a forward with
// statistics the sum and the sum of squares) and the workspace.
Desc variant_pack(const std::vector<const void*>& operands, const std::vector<std::int64_t>& uids,
                  void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  std::vector<void*> pointers;
  for (std::int64_t uid : uids) pointers.push_back(const_cast<void*>(operands[std::size_t(uid - 1)]));
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, std::int64_t(uids.size()), uids.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, std::int64_t(pointers.size()),
      pointers.data());
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  return pack;
}

// A pointwise descriptor of `mode`, in fp32; null where cuDNN refuses it.
Desc pointwise_mode(cudnnPointwiseMode_t mode) {
  Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (mode == CUDNN_POINTWISE_RELU_FWD || mode == CUDNN_POINTWISE_RELU_BWD) {
    // set as cudnn-frontend sets them: max(x, 0), and its gradient
    const double lower = 0.0, upper = std::numeric_limits<float>::max(), slope = 0.0;
    set(pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lower);
    set(pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &upper);
    set(pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &slope);
  }
  return finalized(pw) ? std::move(pw) : Desc();
}

// An element-wise operation of a prologue or epilogue: out = in (op) b (b null for relu
// and identity), in fp32. Its pointwise descriptor goes into `keep`. Null where cuDNN
// refuses either.
Desc pointwise(cudnnPointwiseMode_t mode, const Desc& in, const Desc* b, const Desc& out,
               std::deque<Desc>& keep) {
  Desc pw = pointwise_mode(mode);
  if (!pw.get()) return Desc();
  Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, in);
  if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out);
  keep.push_back(std::move(pw));
  return finalized(op) ? std::move(op) : Desc();
}

// The relu's backward of an epilogue: dx = dy where x > 0, else 0, in fp32. Its
// pointwise descriptor goes into `keep`. Null where cuDNN refuses either.
Desc relu_backward(const Desc& dy, const Desc& x, const Desc& dx, std::deque<Desc>& keep) {
  Desc pw = pointwise_mode(CUDNN_POINTWISE_RELU_BWD);
  if (!pw.get()) return Desc();
  Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
  keep.push_back(std::move(pw));
  return finalized(op) ? std::move(op) : Desc();
}

// An epilogue's sum: out (1, C, 1, 1) = the sum of in over (N, H, W), fp32; asked to
// be deterministic where the rules want it (a cuDNN without the attribute keeps its
// own way, and the engines' notes still say whether they sum with atomics). Its
// reduction descriptor goes into `keep`. Null where cuDNN refuses either.
Desc channel_sum(const Desc& in, const Desc& out, bool deterministic, std::deque<Desc>& keep) {
  Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnReduceTensorOp_t op_type = CUDNN_REDUCE_TENSOR_ADD;
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op_type);
  set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision);
#if CUDNN_VERSION >= 91100  // (the attribute's first release)
  if (deterministic) {
    const bool yes = true;
    (void)cudnnBackendSetAttribute(red.get(), CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1,
                                   &yes);
  }
#else
  (void)deterministic;
#endif
  if (!finalized(red)) return Desc();
  Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, in);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, out);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
  keep.push_back(std::move(red));
  return finalized(op) ? std::move(op) : Desc();
}

// The operands in the graph's order (X, W, Y) from run()'s (a, b, out).
std::array<const void*, 3> xwy(ConvDirection d, const void* a, const void* b, const void* out) {
  switch (d) {
    case ConvDirection::Forward:
      return {a, b, out};
    case ConvDirection::BackwardData:
      return {out, a, b};
    case ConvDirection::BackwardFilter:
    default:
      return {a, out, b};
  }
}

}  // namespace graph_api

using namespace graph_api;

struct CudnnGraphConv::Plan {
  std::deque<Desc> graph;          // tensors, convolution, operations, operation graph (a deque: the
                                   // descriptors are named by reference while it grows)
  std::vector<std::int64_t> uids;  // the variant pack's, in order
  std::vector<Desc> heuristics;    // what the chosen configuration was read from
  Candidate chosen;
  bool ran = false;  // has run once: a failure after that is fatal
  // the variant pack of the last operands and workspace
  Desc pack;
  std::vector<const void*> pointers;
};

CudnnGraphConv::CudnnGraphConv(cudnnHandle_t handle, cudaStream_t stream, DType dtype, bool nhwc,
                               bool deterministic, bool timed, bool mode_b, Workspace workspace)
    : handle_(handle),
      stream_(stream),
      dtype_(dtype),
      nhwc_(nhwc),
      deterministic_(deterministic),
      timed_(timed),
      mode_b_(mode_b),
      workspace_(std::move(workspace)) {}

CudnnGraphConv::~CudnnGraphConv() {
  if (channel_) cudaFreeAsync(channel_, stream_);
}

void CudnnGraphConv::set_tf32(bool on) {
  if (on == tf32_) return;
  tf32_ = on;
  plans_.clear();
}

std::size_t CudnnGraphConv::plans() const {
  std::size_t n = 0;
  for (const auto& [key, p] : plans_) n += p != nullptr;
  return n;
}

std::size_t CudnnGraphConv::declined() const { return plans_.size() - plans(); }

CudnnGraphConv::Plan* CudnnGraphConv::plan(ConvDirection d, const ConvShape& s,
                                           const std::vector<const void*>& operands, float alpha, float beta,
                                           Fusion fusion) {
  const int align[3] = {alignment(operands[0]), alignment(operands[1]), alignment(operands[2])};  // X, W, Y
  int channel_align = 16;  // the per-channel arrays' (scale, bias, sum, sum of squares, mean)
  for (std::size_t i = 3; i < operands.size(); ++i)
    if (operands[i] && std::int64_t(i) + 1 != kBnInput)
      channel_align = std::min(channel_align, alignment(operands[i]));
  // the batch norm's input, in a backward data with its sums
  const int input_align = std::int64_t(operands.size()) >= kBnInput ? alignment(operands[kBnInput - 1]) : 16;
  const Key key{int(d),   s.key(),  alpha,       beta,          align[0],
                align[1], align[2], int(fusion), channel_align, input_align};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  // A fused graph's engines are compiled at run time, as its plan is made: not while
  // the step is captured (the warm-up steps make it; until then the separate passes).
  if (fusion != Fusion::None && capturing(stream_)) return nullptr;

  auto p = std::make_unique<Plan>();
  std::deque<Desc>& g = p->graph;
  const int P = s.out_h(), Q = s.out_w();
  const Desc& x = g.emplace_back(tensor(kX, dtype_, s.n, s.c, s.h, s.w, nhwc_, align[0]));
  const Desc& w = g.emplace_back(tensor(kW, dtype_, s.k, s.c, s.r, s.s, nhwc_, align[1]));
  const Desc& y = g.emplace_back(tensor(kY, dtype_, s.n, s.k, P, Q, nhwc_, align[2]));
  p->uids = {kX, kW, kY};
  bool built = x.get() && w.get() && y.get();

  Desc& conv = g.emplace_back(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial = 2;
  set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &accumulate);
  set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  set_pair(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, s.dilation_h, s.dilation_w);
  set_pair(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, s.stride_h, s.stride_w);
  set_pair(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, s.pad_h, s.pad_w);
  set_pair(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, s.pad_h, s.pad_w);
  built = built && finalized(conv);

  std::vector<cudnnBackendDescriptor_t> ops;  // the graph's operations, in order
  // The prologue (the input rectified from x scale + bias, per channel, fp32, virtual:
  // a forward's or a backward filter's): the convolution reads its last result instead
  // of x.
  const Desc* conv_x = &x;
  const bool narrow_prologue = fusion == Fusion::NarrowPrologueAndStats || fusion == Fusion::NarrowPrologue,
             prologue = narrow_prologue || fusion == Fusion::PrologueAndStats || fusion == Fusion::Prologue,
             stats = fusion == Fusion::Stats || fusion == Fusion::PrologueAndStats ||
                     fusion == Fusion::NarrowPrologueAndStats,
             drelu_sums = fusion == Fusion::DreluSums || fusion == Fusion::DreluSumsOfWritten,
             sums_of_written = fusion == Fusion::DreluSumsOfWritten;
  // A backward data with the relu and sums in its epilogue: the convolution's result
  // is virtual, fp32; the epilogue writes X from it.
  if (built && drelu_sums) {
    const Desc& result = g.emplace_back(tensor(kConvResult, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    built = result.get() != nullptr;
    conv_x = &result;
  }
  if (built && prologue) {
    const DType channel_type = narrow_prologue ? dtype_ : DType::F32;
    const Desc& scale = g.emplace_back(tensor(kScale, channel_type, 1, s.c, 1, 1, true, channel_align));
    const Desc& bias = g.emplace_back(tensor(kBias, channel_type, 1, s.c, 1, 1, true, channel_align));
    const Desc& scaled = g.emplace_back(tensor(kScaled, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& biased = g.emplace_back(tensor(kBiased, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& rectified =
        g.emplace_back(tensor(kRectified, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    p->uids.insert(p->uids.end(), {kScale, kBias});
    built = scale.get() && bias.get() && scaled.get() && biased.get() && rectified.get();
    if (built) {
      const Desc& mul = g.emplace_back(pointwise(CUDNN_POINTWISE_MUL, x, &scale, scaled, g));
      const Desc& add = g.emplace_back(pointwise(CUDNN_POINTWISE_ADD, scaled, &bias, biased, g));
      const Desc& relu = g.emplace_back(pointwise(CUDNN_POINTWISE_RELU_FWD, biased, nullptr, rectified, g));
      built = mul.get() && add.get() && relu.get();
      ops.insert(ops.end(), {mul.get(), add.get(), relu.get()});
      conv_x = &rectified;
    }
  }

  const OperationAttributes& o = operation_attributes(d);
  Desc& op = g.emplace_back(o.type);
  if (built) {  // (a null tensor cannot be set)
    set_desc(op, o.x, *conv_x);
    set_desc(op, o.w, w);
    set_desc(op, o.y, y);
    set_desc(op, o.conv, conv);
    set(op, o.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);  // FLOAT for the fp32 accumulation (DOUBLE for double)
    set(op, o.beta, CUDNN_TYPE_FLOAT, 1, &beta);
    built = finalized(op);
    ops.push_back(op.get());
  }

  // The epilogue of a backward data (DreluSums): the batch norm's map applied to its
  // input a again (x scale + bias, fp32, as the forward's prologue applied it), the
  // convolution's result through that relu's mask (fp32, virtual), written into X in
  // the I/O type, and per channel its sums and those of it times (a - mean), fp32 (what
  // the batch norm's backward needs), of the fp32 values before X's rounding; or
  // (DreluSumsOfWritten) the mask's result X itself, and the sums read from it.
  if (built && drelu_sums) {
    const Desc& a = g.emplace_back(tensor(kBnInput, dtype_, s.n, s.c, s.h, s.w, nhwc_, input_align));
    const Desc& scale = g.emplace_back(tensor(kScale, DType::F32, 1, s.c, 1, 1, true, channel_align));
    const Desc& bias = g.emplace_back(tensor(kBias, DType::F32, 1, s.c, 1, 1, true, channel_align));
    const Desc& mean = g.emplace_back(tensor(kMean, DType::F32, 1, s.c, 1, 1, true, channel_align));
    const Desc& sum = g.emplace_back(tensor(kSum, DType::F32, 1, s.c, 1, 1, true, channel_align));
    const Desc& centred_sum = g.emplace_back(tensor(kSqsum, DType::F32, 1, s.c, 1, 1, true, channel_align));
    const Desc& scaled = g.emplace_back(tensor(kScaled, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& biased = g.emplace_back(tensor(kBiased, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& centred = g.emplace_back(tensor(kCentred, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& product = g.emplace_back(tensor(kProduct, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    const Desc& masked = g.emplace_back(tensor(kMasked, DType::F32, s.n, s.c, s.h, s.w, nhwc_, 16, true));
    p->uids.insert(p->uids.end(), {kScale, kBias, kSum, kSqsum, kBnInput, kMean});
    built = a.get() && scale.get() && bias.get() && mean.get() && sum.get() && centred_sum.get() &&
            scaled.get() && biased.get() && centred.get() && product.get() && masked.get();
    if (built) {
      const Desc& mul = g.emplace_back(pointwise(CUDNN_POINTWISE_MUL, a, &scale, scaled, g));
      const Desc& add = g.emplace_back(pointwise(CUDNN_POINTWISE_ADD, scaled, &bias, biased, g));
      const Desc& grad = sums_of_written ? x : masked;  // what the sums read
      const Desc& drelu = g.emplace_back(relu_backward(*conv_x, biased, grad, g));
      const Desc& sub = g.emplace_back(pointwise(CUDNN_POINTWISE_SUB, a, &mean, centred, g));
      const Desc& times = g.emplace_back(pointwise(CUDNN_POINTWISE_MUL, grad, &centred, product, g));
      const Desc& sum_grad = g.emplace_back(channel_sum(grad, sum, deterministic_, g));
      const Desc& sum_product = g.emplace_back(channel_sum(product, centred_sum, deterministic_, g));
      built = mul.get() && add.get() && drelu.get() && sub.get() && times.get() && sum_grad.get() &&
              sum_product.get();
      ops.insert(ops.end(), {mul.get(), add.get(), drelu.get(), sub.get(), times.get(), sum_grad.get(),
                             sum_product.get()});
      if (built && !sums_of_written) {  // X written from the fp32 values
        const Desc& out = g.emplace_back(pointwise(CUDNN_POINTWISE_IDENTITY, masked, nullptr, x, g));
        built = out.get() != nullptr;
        ops.push_back(out.get());
      }
    }
  }

  // The statistics (an epilogue of the forward): y's sum and sum of squares over
  // (N, P, Q) for each of the K channels, fp32, as batch norm's forward needs them.
  if (built && stats) {
    const Desc& sum = g.emplace_back(tensor(kSum, DType::F32, 1, s.k, 1, 1, true, channel_align));
    const Desc& sqsum = g.emplace_back(tensor(kSqsum, DType::F32, 1, s.k, 1, 1, true, channel_align));
    p->uids.insert(p->uids.end(), {kSum, kSqsum});
    Desc& stats = g.emplace_back(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
    built = sum.get() && sqsum.get();
    if (built) {
      const cudnnGenStatsMode_t stats_mode = CUDNN_GENSTATS_SUM_SQSUM;
      const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
      set(stats, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &stats_mode);
      set(stats, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
      set_desc(stats, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y);
      set_desc(stats, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum);
      set_desc(stats, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum);
      built = finalized(stats);
      ops.push_back(stats.get());
    }
  }

  // The handle attributes are marked deprecated in cuDNN 9.19's header (a device
  // properties descriptor may stand in, for plans built without a device); they
  // still serve, and cuDNN 9 before 9.8 needs them.
  Desc& graph = g.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (built) {
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, std::int64_t(ops.size()),
        ops.data());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    built = finalized(graph);
  }
  const cudnnBackendDescriptor_t op_graph = graph.get();

  // The heuristics' ranking, then the fallback list's engines not in it; the rules
  // applied, each finalized into a plan. The heuristics' first that passes is the
  // choice; the timed search keeps up to kMaxAlgos of them and times them. A shape
  // first met while the step is captured takes the heuristics' choice (the timed
  // search waits on the host), as the legacy path does.
  // (Not a fused graph: its trial would need the statistics' arrays too.)
  const bool search = timed_ && fusion == Fusion::None && !capturing(stream_);
  static const bool narrow_sums = env_flag("DDP_CUDNN_NARROW_SUMS");
  const EngineRules rules{dtype_ == DType::F32, tf32_, deterministic_, narrow_sums};
  std::vector<Candidate> candidates;
  std::vector<std::int64_t> seen;  // the candidates' engines
  PassedOver why;
  // Half the device memory free now: a workspace beyond it is not a candidate.
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::int64_t max_workspace = std::int64_t(free_bytes / 2);
  const cudnnBackendHeurMode_t first = mode_b_ ? CUDNN_HEUR_MODE_B : CUDNN_HEUR_MODE_INSTANT;
  for (cudnnBackendHeurMode_t m : {first, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!built || (!search && !candidates.empty()) || int(candidates.size()) >= kMaxAlgos) break;
    for (Desc& config : engine_configs(op_graph, m, p->heuristics)) {
      Candidate c;
      if (!make_candidate(handle_, std::move(config), rules, seen, max_workspace, &c, &why)) continue;
      if (c.engine >= 0) seen.push_back(c.engine);
      candidates.push_back(std::move(c));
      if (!search || int(candidates.size()) >= kMaxAlgos) break;
    }
  }

  if (search && candidates.size() > 1) {
    // Each candidate on the call's inputs into an output of its own (zeroed; the
    // call's own output keeps what it holds for beta), twice back to back between two
    // events per round; a warm-up round, then kSearchRounds, ranked by the median.
    const std::size_t out_bytes =
        dtype_size(dtype_) * (d == ConvDirection::Forward        ? std::size_t(s.n) * s.k * P * Q
                              : d == ConvDirection::BackwardData ? std::size_t(s.n) * s.c * s.h * s.w
                                                                 : std::size_t(s.k) * s.c * s.r * s.s);
    void* scratch_out = nullptr;
    CUDA_CHECK(cudaMallocAsync(&scratch_out, out_bytes, stream_));
    CUDA_CHECK(cudaMemsetAsync(scratch_out, 0, out_bytes, stream_));
    std::vector<const void*> trial = operands;  // the output (X, W or Y by direction): a scratch one
    trial[d == ConvDirection::Forward ? 2 : d == ConvDirection::BackwardData ? 0 : 1] = scratch_out;
    cudaEvent_t start = nullptr, stop = nullptr;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<std::vector<float>> times(candidates.size());
    std::vector<char> failed(candidates.size(), 0);  // in any round, the warm-up's too: not timed again
    for (int round = 0; round <= kSearchRounds; ++round)
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (failed[i]) continue;
        Candidate& c = candidates[i];
        void* ws = nullptr;
        if (c.workspace && cudaMallocAsync(&ws, std::size_t(c.workspace), stream_) != cudaSuccess) {
          (void)cudaGetLastError();  // too large for the memory left: not a candidate
          failed[i] = 1;
          continue;
        }
        const Desc pack = variant_pack(trial, p->uids, ws);
        CUDA_CHECK(cudaEventRecord(start, stream_));
        cudnnStatus_t st = cudnnBackendExecute(handle_, c.plan.get(), pack.get());
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle_, c.plan.get(), pack.get());
        if (st != CUDNN_STATUS_SUCCESS) {
          (void)cudaGetLastError();  // a launch error of its own, not the next call's
          failed[i] = 1;
        }
        CUDA_CHECK(cudaEventRecord(stop, stream_));
        CUDA_CHECK(cudaEventSynchronize(stop));
        if (ws) CUDA_CHECK(cudaFreeAsync(ws, stream_));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (round > 0 && !failed[i]) times[i].push_back(ms / 2);
      }
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (failed[i]) times[i] = {-1.0f};
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaFreeAsync(scratch_out, stream_));
    const std::vector<int> order = rank_by_median(times);
    std::vector<Candidate> ranked;
    for (int i : order) {
      std::vector<float> t = times[std::size_t(i)];
      std::sort(t.begin(), t.end());
      if (t.empty() || t.front() < 0) continue;  // failed
      candidates[std::size_t(i)].ms = t[t.size() / 2];
      ranked.push_back(std::move(candidates[std::size_t(i)]));
    }
    candidates = std::move(ranked);
  }

  static const bool log = env_flag("DDP_CUDNN_LOG");
  char shape[192];
  std::snprintf(shape, sizeof shape, "%s %s conv %s%s N%d C%d H%d W%d K%d R%d S%d pad %d stride %d",
                dtype_name(dtype_), nhwc_ ? "nhwc" : "nchw", direction_name(d),
                fusion == Fusion::Stats              ? " with statistics"
                : fusion == Fusion::PrologueAndStats ? " after scale-bias-relu (fp32), with statistics"
                : fusion == Fusion::NarrowPrologueAndStats
                    ? " after scale-bias-relu (narrow), with statistics"
                : fusion == Fusion::Prologue       ? " after scale-bias-relu (fp32)"
                : fusion == Fusion::NarrowPrologue ? " after scale-bias-relu (narrow)"
                : fusion == Fusion::DreluSums      ? " with scale-bias-relu's backward and its sums"
                : fusion == Fusion::DreluSumsOfWritten
                    ? " with scale-bias-relu's backward and its sums (of the written gradient)"
                    : "",
                s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.pad_h, s.stride_h);
  if (candidates.empty()) {
    declined_reason_ =
        std::string(shape) + ": " +
        (built ? "no engine taken: " + why.text() : std::string("cuDNN refused the graph itself"));
    if (log) std::fprintf(stderr, "cuDNN graph API %s (another way runs it)\n", declined_reason_.c_str());
    return plans_.emplace(key, nullptr).first->second.get();
  }
  p->chosen = std::move(candidates.front());
  if (log) {
    char ms[48] = "";
    if (p->chosen.ms >= 0)
      std::snprintf(ms, sizeof ms, ", %.3f ms the fastest of %zu", double(p->chosen.ms), candidates.size());
    std::fprintf(stderr,
                 "cuDNN graph API %s alpha %g beta %g align %d/%d/%d: engine %lld (%lld B workspace%s%s%s)\n",
                 shape, double(alpha), double(beta), align[0], align[1], align[2],
                 static_cast<long long>(p->chosen.engine), static_cast<long long>(p->chosen.workspace),
                 p->chosen.notes.empty() ? "" : "; ", p->chosen.notes.c_str(), ms);
  }
  return plans_.emplace(key, std::move(p)).first->second.get();
}

bool CudnnGraphConv::run(ConvDirection d, const ConvShape& s, const void* a, const void* b, void* out,
                         float alpha, float beta, const char* label, const std::string& detail) {
  const std::array<const void*, 3> x_w_y = xwy(d, a, b, out);
  return execute(d, s, {x_w_y[0], x_w_y[1], x_w_y[2]}, alpha, beta, Fusion::None, label, detail);
}

bool CudnnGraphConv::forward_stats(const ConvShape& s, const void* x, const void* w, void* y,
                                   const float* scale, const float* bias, float* sum, float* sqsum,
                                   const char* label, const std::string& detail) {
  if (dtype_ == DType::F32 || !nhwc_) return false;  // cuDNN fuses bf16/fp16 channels-last alone
  if (!sum || !sqsum || (scale == nullptr) != (bias == nullptr)) return false;
  // Zeroed first: the engines are not documented to overwrite rather than add.
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(float) * std::size_t(s.k), stream_));
  CUDA_CHECK(cudaMemsetAsync(sqsum, 0, sizeof(float) * std::size_t(s.k), stream_));
  if (!scale)
    return execute(ConvDirection::Forward, s, {x, w, y, nullptr, nullptr, sum, sqsum}, 1.0f, 0.0f,
                   Fusion::Stats, label, detail);
  // Scale and bias in fp32 (batch norm's own type) where cuDNN has an engine for that;
  // NVIDIA's samples of this fusion keep them in the I/O type, so else, in fp16,
  // narrowed to it (into a small buffer of this object's) and tried again. Not bf16:
  // its 8 bits on bias = beta - mean scale, which is about mean / std where the
  // normalised value is about 1, would move the input by up to mean / std times its
  // rounding, beyond the bf16 rounding of the input the unfused path has.
  if (execute(ConvDirection::Forward, s, {x, w, y, scale, bias, sum, sqsum}, 1.0f, 0.0f,
              Fusion::PrologueAndStats, label, detail))
    return true;
  if (dtype_ != DType::F16) return false;
  const char* narrow_scale = static_cast<const char*>(narrowed(scale, bias, s.c));
  if (!narrow_scale) return false;
  const char* narrow_bias = narrow_scale + std::size_t(s.c) * dtype_size(dtype_);
  // (zeroed again: a plan that failed its first run may have added to them)
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(float) * std::size_t(s.k), stream_));
  CUDA_CHECK(cudaMemsetAsync(sqsum, 0, sizeof(float) * std::size_t(s.k), stream_));
  return execute(ConvDirection::Forward, s, {x, w, y, narrow_scale, narrow_bias, sum, sqsum}, 1.0f, 0.0f,
                 Fusion::NarrowPrologueAndStats, label, detail);
}

bool CudnnGraphConv::backward_filter_after(const ConvShape& s, const void* x, const void* dy, void* dw,
                                           const float* scale, const float* bias, const char* label,
                                           const std::string& detail) {
  if (dtype_ == DType::F32 || !nhwc_ || !scale || !bias) return false;  // as forward_stats
  // The graph's operands by unique id: X, then W (dw, its output), Y (dy), scale, bias.
  if (execute(ConvDirection::BackwardFilter, s, {x, dw, dy, scale, bias}, 1.0f, 0.0f, Fusion::Prologue, label,
              detail))
    return true;
  if (dtype_ != DType::F16) return false;  // as forward_stats: no bf16 map
  const char* narrow_scale = static_cast<const char*>(narrowed(scale, bias, s.c));
  if (!narrow_scale) return false;
  const char* narrow_bias = narrow_scale + std::size_t(s.c) * dtype_size(dtype_);
  return execute(ConvDirection::BackwardFilter, s, {x, dw, dy, narrow_scale, narrow_bias}, 1.0f, 0.0f,
                 Fusion::NarrowPrologue, label, detail);
}

bool CudnnGraphConv::backward_data_sums(const ConvShape& s, const void* w, const void* dy, void* dx,
                                        const void* a, const float* scale, const float* bias,
                                        const float* mean, float* sum, float* centred_sum, const char* label,
                                        const std::string& detail) {
  if (dtype_ == DType::F32 || !nhwc_ || !scale || !bias || !mean || !sum || !centred_sum) return false;
  // Zeroed first, as forward_stats's: the sums are not documented to be written rather than added to.
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(float) * std::size_t(s.c), stream_));
  CUDA_CHECK(cudaMemsetAsync(centred_sum, 0, sizeof(float) * std::size_t(s.c), stream_));
  // The graph's operands by unique id: X (dx, its output), W, Y (dy), scale, bias, the
  // two sums, four intermediates (none in memory), a, mean.
  const std::vector<const void*> operands = {dx,      w,       dy,      scale,   bias, sum, centred_sum,
                                             nullptr, nullptr, nullptr, nullptr, a,    mean};
  if (execute(ConvDirection::BackwardData, s, operands, 1.0f, 0.0f, Fusion::DreluSums, label, detail))
    return true;
  // The same sums of the gradient as written, where cuDNN takes that form and not the
  // first (zeroed again: a plan that failed its first run may have added to them).
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(float) * std::size_t(s.c), stream_));
  CUDA_CHECK(cudaMemsetAsync(centred_sum, 0, sizeof(float) * std::size_t(s.c), stream_));
  return execute(ConvDirection::BackwardData, s, operands, 1.0f, 0.0f, Fusion::DreluSumsOfWritten, label,
                 detail);
}

const void* CudnnGraphConv::narrowed(const float* scale, const float* bias, int C) {
  const std::size_t bytes = 2 * std::size_t(C) * dtype_size(dtype_);
  if (bytes > channel_bytes_) {
    if (capturing(stream_)) return nullptr;  // the buffer would have to grow
    if (channel_) {
      CUDA_CHECK(cudaFreeAsync(channel_, stream_));
      // a captured step graph may point at the old block
      device_block_freed("the narrowed scale and bias of a fused convolution (" +
                         std::to_string(channel_bytes_) + " bytes, growing to " + std::to_string(bytes) +
                         ")");
    }
    CUDA_CHECK(cudaMallocAsync(&channel_, bytes, stream_));
    channel_bytes_ = bytes;
  }
  char* narrow_scale = static_cast<char*>(channel_);
  convert_from_f32(scale, narrow_scale, dtype_, std::size_t(C), stream_);
  convert_from_f32(bias, narrow_scale + std::size_t(C) * dtype_size(dtype_), dtype_, std::size_t(C), stream_);
  return narrow_scale;
}

bool CudnnGraphConv::execute(ConvDirection d, const ConvShape& s, const std::vector<const void*>& operands,
                             float alpha, float beta, Fusion fusion, const char* label,
                             const std::string& detail) {
  Plan* p = plan(d, s, operands, alpha, beta, fusion);
  if (!p) return false;
  void* ws = p->chosen.workspace ? workspace_(std::size_t(p->chosen.workspace)) : nullptr;
  std::vector<const void*> pointers = operands;
  pointers.push_back(ws);
  if (!p->pack.get() || pointers != p->pointers) {
    p->pack = variant_pack(operands, p->uids, ws);
    p->pointers = std::move(pointers);
  }
  cudnnStatus_t st;
  {
    const kernel_trace::Timed timed(label, detail.c_str());
    st = cudnnBackendExecute(handle_, p->chosen.plan.get(), p->pack.get());
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    p->ran = true;
    return true;
  }
  (void)cudaGetLastError();  // a launch error of this call's, not the next one's
  // A plan that finalized and then fails its first run (PyTorch tries each plan's run
  // for this reason): the caller's other way takes that convolution from now on, unless
  // the run blended into its output (beta != 0), which may now hold part of a sum.
  DDP_REQUIRE(!p->ran && !capturing(stream_) && beta == 0.0f,
              "cuDNN graph-API convolution "
                  << direction_name(d) << " (N" << s.n << " C" << s.c << " " << s.h << "x" << s.w << " K"
                  << s.k << " " << s.r << "x" << s.s << ") engine " << p->chosen.engine << " failed: "
                  << cudnnGetErrorString(st) << " (DDP_CUDNN_GRAPH=0 runs the legacy API instead)");
  if (env_flag("DDP_CUDNN_LOG"))
    std::fprintf(stderr, "cuDNN graph API conv %s engine %lld failed its first run (%s): not used again\n",
                 direction_name(d), static_cast<long long>(p->chosen.engine), cudnnGetErrorString(st));
  for (auto& [key, held] : plans_)
    if (held.get() == p) held.reset();
  return false;
}

}  // namespace ddp::cuda
