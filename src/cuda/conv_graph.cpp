#include "cuda/conv_graph.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "cuda/conv_search.hpp"
#include "cuda/cuda_check.hpp"
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
// (in backward, dx is the X tensor, dw the W tensor and dy the Y tensor).
constexpr std::int64_t kX = 1, kW = 2, kY = 3;

// Whether d finalized: a descriptor cuDNN refuses declines the convolution to the
// legacy path rather than ending the run.
bool finalized(const Desc& d) { return cudnnBackendFinalize(d.get()) == CUDNN_STATUS_SUCCESS; }

// A 4-D tensor given in NCHW order (as the graph API takes every layout), its strides
// NCHW or channels-last; null where cuDNN does not finalize it.
Desc tensor(std::int64_t uid, DType t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
            bool nhwc, std::int64_t alignment) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t type = cudnn_type(t);
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

// The configuration as a candidate: its engine's notes against the rules, then a plan
// finalized for it. False where the rules leave it out, its engine is among `skip`
// (one already a candidate), it does not finalize, or its workspace exceeds
// max_workspace (more than the device has to spare: PyTorch too passes over a plan
// whose workspace cannot be had).
bool make_candidate(cudnnHandle_t handle, Desc config, const EngineRules& rules,
                    const std::vector<std::int64_t>& skip, std::int64_t max_workspace, Candidate* out) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &e) != CUDNN_STATUS_SUCCESS)
    return false;
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               std::int64_t(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  notes.resize(std::size_t(std::min<std::int64_t>(count, std::int64_t(notes.size()))));
  if (!engine_allowed(notes, rules)) return false;
  std::int64_t index = -1;
  (void)cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  if (index >= 0 && std::find(skip.begin(), skip.end(), index) != skip.end()) return false;

  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS) return false;
  std::int64_t bytes = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                               &bytes) != CUDNN_STATUS_SUCCESS ||
      bytes < 0 || bytes > max_workspace)
    return false;
  out->config = std::move(config);
  out->plan = std::move(plan);
  out->workspace = bytes;
  out->engine = index;
  out->notes = note_names(notes);
  return true;
}

// A finalized variant pack: the operands by unique id (X, W, Y) and the workspace.
Desc variant_pack(const std::array<const void*, 3>& xwy, void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::int64_t uids[3] = {kX, kW, kY};
  void* pointers[3] = {const_cast<void*>(xwy[0]), const_cast<void*>(xwy[1]), const_cast<void*>(xwy[2])};
  set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
  set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  return pack;
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
  std::vector<Desc> graph;       // tensors, convolution, operation, operation graph
  std::vector<Desc> heuristics;  // what the chosen configuration was read from
  Candidate chosen;
  bool ran = false;  // has run once: a failure after that is fatal
  // the variant pack of the last operands and workspace
  Desc pack;
  std::array<const void*, 4> pointers{};
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

CudnnGraphConv::~CudnnGraphConv() = default;

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

CudnnGraphConv::Plan* CudnnGraphConv::plan(ConvDirection d, const ConvShape& s, const void* a, const void* b,
                                           void* out, float alpha, float beta) {
  const std::array<const void*, 3> ops = xwy(d, a, b, out);
  const int align[3] = {alignment(ops[0]), alignment(ops[1]), alignment(ops[2])};  // X, W, Y
  const Key key{int(d), s.key(), alpha, beta, align[0], align[1], align[2]};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();

  auto p = std::make_unique<Plan>();
  std::vector<Desc>& g = p->graph;
  g.reserve(6);  // x, w and y below are read while the graph is built
  const int P = s.out_h(), Q = s.out_w();
  g.push_back(tensor(kX, dtype_, s.n, s.c, s.h, s.w, nhwc_, align[0]));
  g.push_back(tensor(kW, dtype_, s.k, s.c, s.r, s.s, nhwc_, align[1]));
  g.push_back(tensor(kY, dtype_, s.n, s.k, P, Q, nhwc_, align[2]));
  const Desc &x = g[0], &w = g[1], &y = g[2];

  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
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
  bool built = x.get() && w.get() && y.get() && finalized(conv);

  const OperationAttributes& o = operation_attributes(d);
  Desc op(o.type);
  if (built) {  // (a null tensor cannot be set)
    set_desc(op, o.x, x);
    set_desc(op, o.w, w);
    set_desc(op, o.y, y);
    set_desc(op, o.conv, conv);
    set(op, o.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);  // FLOAT for the fp32 accumulation (DOUBLE for double)
    set(op, o.beta, CUDNN_TYPE_FLOAT, 1, &beta);
    built = finalized(op);
  }

  // The handle attributes are marked deprecated in cuDNN 9.19's header (a device
  // properties descriptor may stand in, for plans built without a device); they
  // still serve, and cuDNN 9 before 9.8 needs them.
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (built) {
    set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    built = finalized(graph);
  }
  g.push_back(std::move(conv));
  g.push_back(std::move(op));
  g.push_back(std::move(graph));
  const cudnnBackendDescriptor_t op_graph = g.back().get();

  // The heuristics' ranking, then the fallback list's engines not in it; the rules
  // applied, each finalized into a plan. The heuristics' first that passes is the
  // choice; the timed search keeps up to kMaxAlgos of them and times them. A shape
  // first met while the step is captured takes the heuristics' choice (the timed
  // search waits on the host), as the legacy path does.
  const bool search = timed_ && !capturing(stream_);
  static const bool narrow_sums = env_flag("DDP_CUDNN_NARROW_SUMS");
  const EngineRules rules{dtype_ == DType::F32, tf32_, deterministic_, narrow_sums};
  std::vector<Candidate> candidates;
  std::vector<std::int64_t> seen;  // the candidates' engines
  // Half the device memory free now: a workspace beyond it is not a candidate.
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::int64_t max_workspace = std::int64_t(free_bytes / 2);
  const cudnnBackendHeurMode_t first = mode_b_ ? CUDNN_HEUR_MODE_B : CUDNN_HEUR_MODE_INSTANT;
  for (cudnnBackendHeurMode_t m : {first, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!built || (!search && !candidates.empty()) || int(candidates.size()) >= kMaxAlgos) break;
    for (Desc& config : engine_configs(op_graph, m, p->heuristics)) {
      Candidate c;
      if (!make_candidate(handle_, std::move(config), rules, seen, max_workspace, &c)) continue;
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
    const std::array<const void*, 3> trial = xwy(d, a, b, scratch_out);
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
        const Desc pack = variant_pack(trial, ws);
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
  char shape[128];
  std::snprintf(shape, sizeof shape, "%s %s conv %s N%d C%d H%d W%d K%d R%d S%d pad %d stride %d",
                dtype_name(dtype_), nhwc_ ? "nhwc" : "nchw", direction_name(d), s.n, s.c, s.h, s.w, s.k, s.r,
                s.s, s.pad_h, s.stride_h);
  if (candidates.empty()) {
    if (log)
      std::fprintf(stderr, "cuDNN graph API %s: no engine passes the rules (the legacy API runs it)\n",
                   shape);
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
  Plan* p = plan(d, s, a, b, out, alpha, beta);
  if (!p) return false;
  const std::array<const void*, 3> ops = xwy(d, a, b, out);
  void* ws = p->chosen.workspace ? workspace_(std::size_t(p->chosen.workspace)) : nullptr;
  const std::array<const void*, 4> pointers{ops[0], ops[1], ops[2], ws};
  if (!p->pack.get() || pointers != p->pointers) {
    p->pack = variant_pack(ops, ws);
    p->pointers = pointers;
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
  // for this reason): the legacy API takes that convolution from now on.
  DDP_REQUIRE(!p->ran && !capturing(stream_), "cuDNN graph-API convolution "
                                                  << direction_name(d) << " engine " << p->chosen.engine
                                                  << " failed: " << cudnnGetErrorString(st));
  if (env_flag("DDP_CUDNN_LOG"))
    std::fprintf(stderr,
                 "cuDNN graph API conv %s engine %lld failed its first run (%s): the legacy API runs it\n",
                 direction_name(d), static_cast<long long>(p->chosen.engine), cudnnGetErrorString(st));
  for (auto& [key, held] : plans_)
    if (held.get() == p) held.reset();
  return false;
}

}  // namespace ddp::cuda
