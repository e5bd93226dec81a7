#include "cuda/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda/batch_norm.hpp"
#include "cuda/conv.hpp"
#include "cuda/conv_epilogue.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/dtype.hpp"
#include "cuda/flash_attention.hpp"
#include "cuda/gemm.hpp"
#include "cuda/gemm_lt.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {

DType dtype_of(Precision p) {
  switch (p) {
    case Precision::fp32:
      return DType::F32;
    case Precision::bf16:
      return DType::BF16;
    case Precision::fp16:
      return DType::F16;
  }
  return DType::F32;
}

// Device memory for the reduced-precision copies of operands and outputs, one slot
// per role, grown on demand. Every call runs on the one stream, so a slot is free
// again as soon as the call that used it is queued. A grown slot keeps its old
// block until the backend goes: a benchmark's replay of an earlier call may still
// point there.
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    cudaStreamSynchronize(stream_);
    for (void* p : blocks_) cudaFree(p);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  enum Slot { A, B, C, kSlots };
  void* get(Slot slot, std::size_t bytes) {
    if (bytes > bytes_[slot]) {
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, bytes));
      blocks_.push_back(p);
      slots_[slot] = p;
      bytes_[slot] = bytes;
    }
    return slots_[slot];
  }

 private:
  cudaStream_t stream_;
  void* slots_[kSlots] = {};
  std::size_t bytes_[kSlots] = {};
  std::vector<void*> blocks_;
};

// The reduced-precision copy of an fp32 operand: `from` itself for fp32.
const void* narrowed(const float* from, std::size_t n, DType t, Scratch& scratch, Scratch::Slot slot,
                     cudaStream_t stream) {
  if (t == DType::F32) return from;
  void* to = scratch.get(slot, n * dtype_size(t));
  convert_from_f32(from, to, t, n, stream);
  return to;
}

// The fp32 copy of an operand rounded to `t`'s values (`from` itself for fp32).
const float* rounded(const float* from, std::size_t n, DType t, Scratch& scratch, Scratch::Slot slot,
                     cudaStream_t stream) {
  if (t == DType::F32) return from;
  float* to = static_cast<float*>(scratch.get(slot, n * sizeof(float)));
  round_to(from, to, t, n, stream);
  return to;
}

// bf16/fp16 convolutions on cuDNN's own bf16/fp16 tensor-core kernels, channels-last
// (see CudnnConvKernels), unless DDP_CUDNN_NARROW=0: then on operands rounded to the
// precision in cuDNN's fp32 kernels, the host's arithmetic.
bool narrow_convolutions() {
  static const bool on = env_flag("DDP_CUDNN_NARROW", /*unset=*/true);
  return on;
}

// DDP_CUDNN_BENCHMARK=1: each convolution shape's algorithms are run and timed at
// first use (CudnnConv::Search::Benchmark) and the fastest deterministic one is taken,
// as PyTorch's cudnn.benchmark does; timings can then choose differently in another run, so two
// runs, or a run and its resume, need not repeat bit for bit. Unset: cuDNN's
// heuristics, the same choice every run.
CudnnConv::Search convolution_search() {
  static const bool on = env_flag("DDP_CUDNN_BENCHMARK");
  return on ? CudnnConv::Search::Benchmark : CudnnConv::Search::Heuristic;
}

// DDP_CUDNN_DETERMINISTIC=0: a nondeterministic algorithm (one that sums with atomics
// in an order that changes from run to run) may be chosen where it ranks first, as
// PyTorch's cudnn.benchmark takes them; a run then does not repeat bit for bit, nor a
// resume a straight run. Unset or 1: deterministic ones first.
bool deterministic_convolutions() {
  static const bool on = env_flag("DDP_CUDNN_DETERMINISTIC", /*unset=*/true);
  return on;
}

// DDP_CUDNN_GRAPH=1: the convolutions through cuDNN's graph API (cuda/conv_graph.hpp),
// engines chosen as PyTorch chooses them; each one it has no allowed engine for runs
// as without it. Off by default: compiled, and not yet run on a GPU.
bool graph_convolutions() {
  static const bool on = env_flag("DDP_CUDNN_GRAPH");
  return on;
}

// DDP_CUDNN_STATS=0: with the graph API, the convolutions before a residual block's
// batch norms run alone, and the batch norms take their own sums, as without it.
// Unset or 1: each such convolution writes the sums of its output in its own graph
// ("conv -> genstats", CudnnConv::forward_stats) where cuDNN has an engine for it.
bool convolution_statistics() {
  static const bool on = env_flag("DDP_CUDNN_STATS", /*unset=*/true);
  return on;
}

// DDP_CUDNN_PROLOGUE=0: with those sums, each batch norm of a residual branch before a
// convolution writes its rectified output for it, as without the prologue. Unset or 1:
// the convolution applies the batch norm and relu to its input on the way in
// ("scale-bias-relu -> conv -> genstats", and "scale-bias-relu -> wgrad" for its
// weights' gradient), where cuDNN has engines for them.
bool convolution_prologue() {
  static const bool on = env_flag("DDP_CUDNN_PROLOGUE", /*unset=*/true);
  return on;
}

// DDP_CUDNN_DGRAD_SUMS=0: with the prologue, the data gradient of such a convolution is
// written as without it, and the batch norm before it makes its own pass for its
// backward's sums. Unset or 1: the data gradient comes through that batch norm's relu,
// with those sums, in the convolution's epilogue (cuDNN's "dgrad -> drelu -> dbn" in its
// generic runtime fusion), where cuDNN has an engine for it.
bool convolution_backward_sums() {
  static const bool on = env_flag("DDP_CUDNN_DGRAD_SUMS", /*unset=*/true);
  return on;
}

// DDP_CUDNN_HEURISTICS=B: the graph API's heuristics in mode B (slower to choose, a
// model of the device) instead of INSTANT (PyTorch's default). Any other value is an
// input error at start-up (the compute line reads it), so that a misspelt one does not
// pass unnoticed.
bool heuristics_mode_b() {
  static const bool b = [] {
    const char* v = std::getenv("DDP_CUDNN_HEURISTICS");
    const std::string mode = v ? v : "";
    if (!(mode.empty() || mode == "B" || mode == "b" || mode == "INSTANT" || mode == "instant"))
      throw InputError("DDP_CUDNN_HEURISTICS='" + mode +
                       "': the mode of cuDNN's heuristics for the graph API's convolutions, INSTANT or B");
    return mode == "B" || mode == "b";
  }();
  return b;
}

// How the convolutions' algorithms are chosen, for the compute line.
std::string convolution_choice() {
  const bool mode_b = heuristics_mode_b();  // read (and checked) with or without the graph API
  std::string text = convolution_search() == CudnnConv::Search::Benchmark
                         ? "timed per shape (DDP_CUDNN_BENCHMARK=1)"
                         : "cuDNN's heuristics";
  if (graph_convolutions()) text += mode_b ? " (graph API, mode B)" : " (graph API, INSTANT)";
  return text + (deterministic_convolutions()
                     ? ", deterministic"
                     : ", nondeterministic ones allowed (DDP_CUDNN_DETERMINISTIC=0)");
}

// DDP_CUDNN_BATCHNORM=1: BatchNorm2d's training passes on bf16/fp16 channels-last
// tensors run cuDNN's batch norm (cuda/batch_norm.hpp) instead of the model's own
// Kokkos kernels; off by default until the step has been timed with it.
bool cudnn_batch_norm() {
  static const bool on = env_flag("DDP_CUDNN_BATCHNORM");
  return on;
}

class CudaBackend;

// bf16/fp16 convolutions run cuDNN's bf16/fp16 kernels, as PyTorch's AMP with
// channels_last does: the model keeps the activations around convolutions NHWC
// (native_*_layout), each convolution reads bf16/fp16 copies of x, w (KRSC) and dy
// and writes y, dx and dw in that type (fp32 accumulation inside), widened into the
// fp32 tensors after, with the bias and relu on the way, where the model keeps them
// fp32. cuDNN's bf16 kernels in NCHW were measured on an H100 at 7 to 15 times the
// fp32 forward time; its tensor-core kernels want NHWC. Rounded outputs move relu
// and max-pool decisions, so this path differs from the host's by more than the
// rounded one (6 to 19% of a one-step gradient measured in NCHW).
//
// DDP_CUDNN_NARROW=0 rounds the operands (x, w, dy) to the narrow type's values and
// runs cuDNN's fp32 kernels instead: bf16 operands, fp32 products and sums, fp32
// results, as the host's oneDNN path, NCHW (no tensor cores: ResNet-50 in bf16 then
// runs at its fp32 speed). The GEMMs (cuBLAS) use the tensor cores either way:
// bf16/fp16 operands, fp32 C.
class CudnnConvKernels final : public ConvKernels {
 public:
  CudnnConvKernels(CudaBackend& backend, const ConvGeometry& g);
  // Its narrow kernels read and write that type: a narrow activation is their operand
  // or result as it is.
  bool takes_narrow_activations(Precision p) const override {
    return p != Precision::fp32 && narrow_convolutions();
  }
  void configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) override;
  // cuDNN's format here: NHWC for its bf16/fp16 kernels, else NCHW. (The blocked
  // layouts are the host backend's.)
  Layout native_input_layout() override { return nhwc_ ? Layout::nhwc : Layout::nchw; }
  Layout native_output_layout() override { return nhwc_ ? Layout::nhwc : Layout::nchw; }
  void forward(std::int64_t B, const float* x, const float* weight, const float* bias, float* y) override;
  void backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight, float* dbias,
                        bool accumulate) override;
  void backward_data(std::int64_t B, const float* dy, const float* weight, float* dx,
                     bool accumulate) override;
  // cuDNN adds (beta = 1) where it writes dx as it is; the epilogue adds where dx is fp32.
  bool accumulates_input_grad() const override { return direct(in_, in_type_) || in_type_ == DType::F32; }
  // Through the graph API, on its narrow channels-last kernels, y written as it is
  // (no epilogue to move it), no bias or relu: the graph's output is y.
  bool has_forward_stats() const override {
    return graph_convolutions() && convolution_statistics() && nhwc_ && io_ != DType::F32 &&
           direct(out_, out_type_) && !g_.bias && !fused_relu_;
  }
  bool forward_stats(std::int64_t B, const float* x, const float* weight, float* y, float* sums) override;
  // The same graphs with the batch norm before applied on the way in, reading x as it
  // is (the layer's narrow channels-last tensor).
  bool has_forward_prologue() const override {
    return has_forward_stats() && convolution_prologue() && direct(in_, in_type_);
  }
  bool forward_stats_after(std::int64_t B, const float* x, const float* scale_shift, const float* weight,
                           float* y, float* sums) override;
  bool backward_weights_after(std::int64_t B, const float* x, const float* scale_shift, const float* dy,
                              float* dweight, bool accumulate) override;
  // The data gradient through the batch norm's relu with its sums, written as it is into
  // the layer's narrow channels-last dx.
  bool has_backward_data_sums() const override {
    return has_forward_prologue() && convolution_backward_sums();
  }
  bool backward_data_sums(std::int64_t B, const float* dy, const float* weight, const float* x,
                          const float* scale_shift, const float* mean, float* dx, float* sums) override;

 private:
  ConvShape shape(std::int64_t B) const;
  CudnnConv& conv();

  // An operand (N, C, HW) of type from_type (fp32, or io_ where narrow), NHWC where
  // from_nhwc, as cuDNN reads it here: in its format, narrowed into scratch (its
  // narrow kernels) or rounded in fp32 (the default) at the configured precision, or
  // `from` itself where nothing differs.
  const void* operand(const void* from, DType from_type, bool from_nhwc, std::int64_t N, std::int64_t C,
                      std::int64_t hw, Scratch::Slot slot);
  // Whether cuDNN writes a result of `layout` and `type` straight into the layer's tensor.
  bool direct(Layout layout, DType type) const { return io_ == type && (layout == Layout::nhwc) == nhwc_; }
  // A result (N, C, HW) cuDNN wrote at `from` (its format, type io_; the layer's
  // tensor itself where direct) into `to` (of to_type, NHWC where to_nhwc): + bias,
  // relu?, or added to what `to` holds (fp32 only).
  void result(const void* from, void* to, DType to_type, bool to_nhwc, std::int64_t N, std::int64_t C,
              std::int64_t hw, const float* bias, bool relu, bool add);

  CudaBackend& backend_;
  ConvGeometry g_;
  DType dtype_ = DType::F32;  // the operands' precision
  DType io_ = DType::F32;     // what cuDNN reads and writes: dtype_, or fp32 under DDP_CUDNN_NARROW=0
  bool nhwc_ = false;         // cuDNN's tensors NHWC, filters KRSC (its narrow kernels)
  Layout in_ = Layout::nchw, out_ = Layout::nchw;  // the layer's x and dx, y and dy
  DType in_type_ = DType::F32, out_type_ = DType::F32;
  bool fused_relu_ = false;
  const float* dy_narrowed_ = nullptr;     // backward weights left this dy's copy in slot B
  std::set<std::int64_t> stats_declined_;  // batch sizes forward_stats found no graph for
  std::set<std::int64_t> after_declined_;  // and forward_stats_after
  std::set<std::int64_t> wgrad_declined_;  // and backward_weights_after
  std::set<std::int64_t> dgrad_declined_;  // and backward_data_sums
};

class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(cudaStream_t stream) : stream_(stream), gemm_(stream), lt_(stream), scratch_(stream) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int cublas_version = 0;
    CUBLAS_CHECK(cublasGetVersion(gemm_.handle(), &cublas_version));
    const std::size_t cudnn_version = cudnnGetVersion();
    major_ = prop.major;
    minor_ = prop.minor;
    // Test hook: DDP_TEST_COMPUTE_CAPABILITY=7.0 pretends an older GPU (its precision check).
    if (const char* cc = std::getenv("DDP_TEST_COMPUTE_CAPABILITY"))
      DDP_REQUIRE(std::sscanf(cc, "%d.%d", &major_, &minor_) == 2,
                  "DDP_TEST_COMPUTE_CAPABILITY='" << cc << "': expected <major>.<minor>");
    gpu_ = "GPU " + std::to_string(device) + ", " + prop.name + " (sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ")";
    name_ = "cuBLAS " + std::to_string(cublas_version / 10000) + "." +
            std::to_string(cublas_version / 100 % 100) + " + cuDNN " + std::to_string(cudnn_version / 10000) +
            "." + std::to_string(cudnn_version / 100 % 100) + " on " + gpu_ +
            "; convolution algorithms: " + convolution_choice();
  }

  std::string name() const override { return name_; }
  std::string precision_text(Precision p) const override {
    switch (p) {
      case Precision::fp32:
        return tf32_ ? "fp32 on TF32 tensor cores (cuBLAS/cuDNN; operands rounded to a 10-bit mantissa, fp32 "
                       "sums: train.tf32 = T)"
                     : "fp32 (cuBLAS/cuDNN fp32 kernels, no TF32)";
      case Precision::bf16:
        return narrow_convolutions()
                   ? std::string(
                         "bf16 (cuBLAS and cuDNN bf16 tensor cores, convolutions channels-last, "
                         "fp32 accumulation") +
                         (cudnn_batch_norm() ? "; batch norm in cuDNN)" : ")")
                   : "bf16 (cuBLAS bf16 tensor cores, fp32 accumulation; convolutions on "
                     "bf16-rounded operands in fp32)";
      case Precision::fp16:
        return narrow_convolutions()
                   ? std::string(
                         "fp16 (cuBLAS and cuDNN fp16 tensor cores, convolutions channels-last, "
                         "fp32 accumulation") +
                         (cudnn_batch_norm() ? "; batch norm in cuDNN)" : ")")
                   : "fp16 (cuBLAS fp16 tensor cores, fp32 accumulation; convolutions on "
                     "fp16-rounded operands in fp32)";
    }
    return "?";
  }
  std::string allow_tf32(bool allow) override {
    if (allow && major_ < 8)
      return "the GPU (" + gpu_ + ") has no TF32 tensor cores (compute capability 8.0, Ampere, or newer)";
    tf32_ = allow;
    gemm_.set_tf32(allow);
    lt_.set_tf32(allow);
    for (auto& c : convs_[int(DType::F32)])
      if (c) c->set_tf32(allow);
    return {};
  }
  std::string precision_unsupported(Precision p) const override {
    const std::string why = missing_tensor_cores(p, major_, minor_);
    return why.empty() ? why : "the GPU (" + gpu_ + "): " + why;
  }
  bool narrow_convolution_results(Precision p) const override {
    return p != Precision::fp32 && narrow_convolutions();
  }
  bool device_memory() const override { return true; }

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, Precision precision) override {
    if (m == 0 || n == 0) return;
    const DType t = dtype_of(precision);
    const std::size_t a_size = std::size_t(matrix_span(trans_a ? k : m, trans_a ? m : k, lda)),
                      b_size = std::size_t(matrix_span(trans_b ? n : k, trans_b ? k : n, ldb));
    const void* a_op = operand(a, a_size, precision, Scratch::A);
    const void* b_op = operand(b, b_size, precision, Scratch::B);
    gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({std::string("gemm ") + precision_name(precision) + " " + std::to_string(m) + "x" +
                                std::to_string(n) + "x" + std::to_string(k),
                            2.0 * m * n * k, [=] {
                              gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t);
                            }});
  }

  // A GEMM's operands as cuBLAS takes them: a narrow one as it lies, an fp32 one
  // narrowed as gemm's are (operand()).
  std::pair<const void*, const void*> stored_operands(bool trans_a, bool trans_b, int m, int n, int k,
                                                      const void* a, int lda, const void* b, int ldb,
                                                      Precision precision, GemmStored stored) {
    const std::size_t a_size = std::size_t(matrix_span(trans_a ? k : m, trans_a ? m : k, lda)),
                      b_size = std::size_t(matrix_span(trans_b ? n : k, trans_b ? k : n, ldb));
    return {
        stored.a != Precision::fp32 ? a
                                    : operand(static_cast<const float*>(a), a_size, precision, Scratch::A),
        stored.b != Precision::fp32 ? b
                                    : operand(static_cast<const float*>(b), b_size, precision, Scratch::B)};
  }

  // Operands and results stored narrow (a transformer block's inner activations) are
  // cuBLAS's bf16/fp16 operands and C as they lie: no narrowing copy, and a narrow C
  // written by the GEMM itself (fp32 accumulation, rounded once). The fp32 ones (the
  // weights, an fp32 dy) narrowed as gemm's are.
  bool gemm_takes_stored() const override { return true; }
  void gemm_stored(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                   const void* b, int ldb, float beta, void* c, int ldc, Precision precision,
                   GemmStored stored) override {
    if (m == 0 || n == 0) return;
    const DType t = dtype_of(precision), c_type = stored.c != Precision::fp32 ? t : DType::F32;
    const std::pair<const void*, const void*> ops =
        stored_operands(trans_a, trans_b, m, n, k, a, lda, b, ldb, precision, stored);
    const void *a_op = ops.first, *b_op = ops.second;  // the replay's captures
    gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t, c_type);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record(
          {std::string("gemm ") + precision_name(precision) + " stored " + std::to_string(m) + "x" +
               std::to_string(n) + "x" + std::to_string(k),
           2.0 * m * n * k,
           [=] { gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t, c_type); }});
  }

  // The bias, a residual, the tanh GELU and its gradient in cuBLASLt's epilogue
  // (cuda/gemm_lt.hpp), operands taken as gemm_stored takes them; the rest (a relu, which cuBLASLt's
  // max(x, 0) may not keep NaN through as ours does; the exact GELU, which it does not
  // have) and what it has no algorithm for: false, model/gemm.cpp's GEMM and pass.
  // DDP_CUBLASLT_EPILOGUE=0 turns it off.
  bool gemm_epilogue(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda, const void* b,
                     int ldb, void* c, int ldc, Precision precision, GemmStored stored,
                     const GemmEpilogue& e) override {
    static const bool on = env_flag("DDP_CUBLASLT_EPILOGUE", /*unset=*/true);
    using Act = GemmEpilogue::Act;
    using Lt = CublasLtGemm::Epilogue;
    if (!on || m == 0 || n == 0) return false;
    Lt lt;
    if (e.act == Act::none && e.add)
      lt = e.bias ? Lt::bias : Lt::none;
    else if (e.act == Act::none && e.bias)
      lt = Lt::bias;
    else if (e.act == Act::gelu && e.tanh)
      lt = e.bias ? Lt::gelu_bias : Lt::gelu;
    else if (e.act == Act::dgelu && e.tanh)
      lt = Lt::dgelu;
    else
      return false;
    const DType t = dtype_of(precision), c_type = stored.c != Precision::fp32 ? t : DType::F32;
    // Declined shapes known before the operands are converted (the fallback converts them).
    if (lt_.declines(trans_a, trans_b, m, n, k, lda, ldb, ldc, t, c_type, lt, e.add != nullptr, e.bias))
      return false;
    const std::pair<const void*, const void*> ops =
        stored_operands(trans_a, trans_b, m, n, k, a, lda, b, ldb, precision, stored);
    const void *a_op = ops.first, *b_op = ops.second;  // the replay's captures
    const float* bias = e.bias;
    void* pre = e.pre;
    const float* add = e.add;
    if (!lt_(trans_a, trans_b, m, n, k, a_op, lda, b_op, ldb, c, ldc, t, c_type, lt, bias, pre, add))
      return false;
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({std::string("gemm ") + precision_name(precision) + " epilogue " +
                                std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k),
                            2.0 * m * n * k, [=] {
                              const bool ran = lt_(trans_a, trans_b, m, n, k, a_op, lda, b_op, ldb, c, ldc, t,
                                                   c_type, lt, bias, pre, add);
                              DDP_REQUIRE(ran, "cuBLASLt declined the replay of a call it ran");
                            }});
    return true;
  }

  // Flash attention's kernels (cuda/flash_attention.cu) where this GPU runs them: bf16,
  // sm_80 or later (DDP_TEST_COMPUTE_CAPABILITY's too), the head size's shared memory.
  // In a benchmark's record, forward as its 2 products' flops, backward as its 5.
  bool has_fused_attention(std::int64_t head_size, Precision p) const override {
    return p == Precision::bf16 && major_ >= 8 && flash_attention_supported(head_size);
  }
  void fused_attention_forward(const FusedAttention& a, const float* qkv, float* o, float* stats) override {
    const AttentionDims dims{a.B, a.T, a.heads, a.head_size, a.causal};
    const cudaStream_t stream = stream_;
    flash_attention_forward(dims, qkv, o, stats, stream);
    if (kernel_trace::recording())
      kernel_trace::record({"flash attention forward T=" + std::to_string(a.T),
                            4.0 * a.B * a.heads * a.T * a.T * a.head_size,
                            [=] { flash_attention_forward(dims, qkv, o, stats, stream); }});
  }
  void fused_attention_backward(const FusedAttention& a, const float* qkv, const float* o, const float* d_o,
                                const float* stats, float* delta, float* dqkv) override {
    const AttentionDims dims{a.B, a.T, a.heads, a.head_size, a.causal};
    const cudaStream_t stream = stream_;
    flash_attention_backward(dims, qkv, o, d_o, stats, delta, dqkv, stream);
    if (kernel_trace::recording())
      kernel_trace::record({"flash attention backward T=" + std::to_string(a.T),
                            10.0 * a.B * a.heads * a.T * a.T * a.head_size, [=] {
                              flash_attention_backward(dims, qkv, o, d_o, stats, delta, dqkv, stream);
                            }});
  }

  // One strided-batched cuBLAS call: attention's per-head products, B nh small GEMMs a
  // product in a loop of gemm, launch-bound. A narrow operand's whole span (the
  // batch's matrices and what lies between them) is narrowed at once, the strides
  // kept.

  void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                    float* c, int ldc, std::int64_t stride_c, int batch, Precision precision) override {
    if (m == 0 || n == 0 || batch == 0) return;
    const DType t = dtype_of(precision);
    const std::size_t a_size =
                          std::size_t(batch_span(trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a)),
                      b_size =
                          std::size_t(batch_span(trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b));
    const void* a_op = operand(a, a_size, precision, Scratch::A);
    const void* b_op = operand(b, b_size, precision, Scratch::B);
    gemm_.batched(trans_a, trans_b, m, n, k, alpha, a_op, lda, stride_a, b_op, ldb, stride_b, beta, c, ldc,
                  stride_c, batch, t);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({std::string("gemm batched ") + precision_name(precision) + " " +
                                std::to_string(batch) + " x " + std::to_string(m) + "x" + std::to_string(n) +
                                "x" + std::to_string(k),
                            2.0 * m * n * k * batch, [=] {
                              gemm_.batched(trans_a, trans_b, m, n, k, alpha, a_op, lda, stride_a, b_op, ldb,
                                            stride_b, beta, c, ldc, stride_c, batch, t);
                            }});
  }

  // Attention's (B, nh) per-head products: each operand's whole span (every group's
  // matrices and what lies between them) narrowed once, then a strided-batched call
  // per group or per item, whichever are fewer (ViT-B/16 at batch 256: 12 calls of
  // 256, not 256 calls of 12 each narrowing its sample's span).
  void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                           int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                           GemmSteps item, int groups, GemmSteps group, Precision precision) override {
    if (m == 0 || n == 0 || batch == 0 || groups == 0) return;
    const DType t = dtype_of(precision);
    const std::size_t a_size = std::size_t(
                          batch_span(trans_a ? k : m, trans_a ? m : k, lda, batch, item.a, groups, group.a)),
                      b_size = std::size_t(
                          batch_span(trans_b ? n : k, trans_b ? k : n, ldb, batch, item.b, groups, group.b));
    const char* a_op = static_cast<const char*>(operand(a, a_size, precision, Scratch::A));
    const char* b_op = static_cast<const char*>(operand(b, b_size, precision, Scratch::B));
    const std::size_t e = dtype_size(t);  // the operands' bytes an element; C is fp32
    const bool by_group = groups <= batch;
    const int calls = by_group ? groups : batch, count = by_group ? batch : groups;
    const GemmSteps across = by_group ? group : item, within = by_group ? item : group;
    CublasGemm& gemm = gemm_;
    const auto run = [=, &gemm] {
      for (int j = 0; j < calls; ++j)
        gemm.batched(trans_a, trans_b, m, n, k, alpha, a_op + j * across.a * e, lda, within.a,
                     b_op + j * across.b * e, ldb, within.b, beta, c + j * across.c, ldc, within.c, count, t);
    };
    run();
    for (int j = 0; j < calls; ++j) kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({std::string("gemm batched ") + precision_name(precision) + " " +
                                std::to_string(groups) + " x " + std::to_string(batch) + " x " +
                                std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k),
                            2.0 * m * n * k * batch * groups, run});
  }

  // The copies NarrowedOnce asks for (model/tensor.hpp): converted on the stream, then
  // read by operand() in place of a narrowing of their own until forgotten.
  std::int64_t narrow_copy_floats(std::int64_t n, Precision p) const override {
    const DType t = dtype_of(p);
    return t == DType::F32 ? 0 : (n * std::int64_t(dtype_size(t)) + 3) / 4;
  }
  void narrow_copy(const float* from, std::int64_t n, Precision p, float* to) override {
    const DType t = dtype_of(p);
    convert_from_f32(from, to, t, std::size_t(n), stream_);
    copies_.add(from, n, p, to, dtype_size(t));
  }
  void forget_narrow_copy(const float* from) override { copies_.forget(from); }

  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& geometry) override {
    return std::make_unique<CudnnConvKernels>(*this, geometry);
  }

  BatchNormKernels* batch_norm() override {
    if (!batch_norm_) batch_norm_ = make_cudnn_batch_norm(stream_);
    return batch_norm_.get();
  }
  bool batch_norm_in_library() const override { return cudnn_batch_norm(); }

  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  std::string graphs_unsupported() const override { return {}; }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& record) override;

  cudaStream_t stream() const { return stream_; }
  Scratch& scratch() { return scratch_; }
  // One cuDNN handle and plan cache per operand type and format, made on first use.
  CudnnConv& conv(DType t, bool nhwc) {
    auto& c = convs_[int(t)][nhwc];
    if (!c) {
      c = std::make_unique<CudnnConv>(stream_, t, convolution_search(), nhwc, deterministic_convolutions(),
                                      graph_convolutions(), heuristics_mode_b());
      if (t == DType::F32) c->set_tf32(tf32_);
    }
    return *c;
  }

 private:
  // A GEMM operand at `precision`: the floats themselves at fp32, else a kept copy's
  // elements where one holds the span (NarrowedOnce), else narrowed into `slot`.
  const void* operand(const float* from, std::size_t span, Precision precision, Scratch::Slot slot) {
    const DType t = dtype_of(precision);
    if (t == DType::F32) return from;
    if (const void* kept = copies_.find(from, std::int64_t(span), precision)) return kept;
    return narrowed(from, span, t, scratch_, slot, stream_);
  }

  cudaStream_t stream_;
  CublasGemm gemm_;
  CublasLtGemm lt_;
  Scratch scratch_;
  NarrowCopies copies_;
  std::unique_ptr<CudnnConv> convs_[3][2];
  std::unique_ptr<BatchNormKernels> batch_norm_;
  std::string name_;
  std::string gpu_;            // "GPU n, its name (sm_xy)"
  bool tf32_ = false;          // train.tf32, where the GPU has TF32
  int major_ = 0, minor_ = 0;  // the device's compute capability
};

// A graph instantiated from one capture of the stream, launched on it.
class CapturedGraph final : public CapturedWork {
 public:
  CapturedGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CapturedGraph() override {
    cudaStreamSynchronize(stream_);  // a replay still running keeps its graph
    cudaGraphExecDestroy(exec_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void replay() override {
    CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    kernel_trace::count_graph_launch();
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

std::unique_ptr<CapturedWork> CudaBackend::capture(const std::function<void()>& record) {
  // Thread-local: the loader's thread may copy into pinned memory meanwhile; this
  // thread's calls that cannot be captured (a wait, an allocation) fail, and the
  // check that sees it ends the run with the call named (comm/check.cpp adds that a
  // capture was under way).
  const CaptureScope scope;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  record();
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(made);
  return std::make_unique<CapturedGraph>(exec, stream_);
}

CudnnConvKernels::CudnnConvKernels(CudaBackend& backend, const ConvGeometry& g) : backend_(backend), g_(g) {}

void CudnnConvKernels::configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) {
  for (Layout l : {in.layout, out.layout})
    DDP_REQUIRE(l == Layout::nchw || l == Layout::nhwc,
                "cuDNN convolutions here take NCHW or NHWC tensors, not " << layout_name(l));
  dtype_ = dtype_of(precision);
  io_ = narrow_convolutions() ? dtype_ : DType::F32;
  nhwc_ = io_ != DType::F32;
  for (ConvSide side : {in, out})
    DDP_REQUIRE(
        side.type == Precision::fp32 || dtype_of(side.type) == io_,
        "a " << precision_name(side.type) << " activation for a convolution that reads " << dtype_name(io_));
  DDP_REQUIRE(out.type == Precision::fp32 || (!g_.bias && !fused_relu),
              "a narrow convolution output takes no bias or fused relu here");
  in_ = in.layout;
  out_ = out.layout;
  in_type_ = dtype_of(in.type);
  out_type_ = dtype_of(out.type);
  fused_relu_ = fused_relu;
}

const void* CudnnConvKernels::operand(const void* from, DType from_type, bool from_nhwc, std::int64_t N,
                                      std::int64_t C, std::int64_t hw, Scratch::Slot slot) {
  Scratch& scratch = backend_.scratch();
  const cudaStream_t stream = backend_.stream();
  const std::size_t n = std::size_t(N * C * hw);
  if (from_nhwc == nhwc_) {
    if (from_type != DType::F32) return from;  // already io_ (configure)
    const float* f = static_cast<const float*>(from);
    if (io_ != DType::F32) return narrowed(f, n, io_, scratch, slot, stream);
    return rounded(f, n, dtype_, scratch, slot, stream);
  }
  void* to = scratch.get(slot, n * dtype_size(io_));
  transpose_image(from, from_type, to, io_, nhwc_, N, C, hw, nullptr, false, false, stream);
  if (io_ == DType::F32 && dtype_ != DType::F32)
    round_to(static_cast<float*>(to), static_cast<float*>(to), dtype_, n, stream);
  return to;
}

void CudnnConvKernels::result(const void* from, void* to, DType to_type, bool to_nhwc, std::int64_t N,
                              std::int64_t C, std::int64_t hw, const float* bias, bool relu, bool add) {
  const cudaStream_t stream = backend_.stream();
  if (to_type != DType::F32) {  // io_ (configure), no bias, relu or sum: a move where formats differ
    if (to_nhwc != nhwc_)
      transpose_image(from, io_, to, to_type, to_nhwc, N, C, hw, nullptr, false, false, stream);
    return;
  }
  float* f = static_cast<float*>(to);
  if (to_nhwc != nhwc_)
    transpose_image(from, io_, f, DType::F32, to_nhwc, N, C, hw, bias, relu, add, stream);
  else if (add)
    ::ddp::cuda::accumulate(from, io_, f, std::size_t(N * C * hw), true, stream);
  else
    bias_relu(from, io_, f, bias, N, C, hw, relu, to_nhwc, stream);  // nothing to do in place without both
}

ConvShape CudnnConvKernels::shape(std::int64_t B) const {
  ConvShape s;
  s.n = int(B);
  s.c = int(g_.in);
  s.h = int(g_.h);
  s.w = int(g_.w);
  s.k = int(g_.out);
  s.r = s.s = int(g_.k);
  s.pad_h = s.pad_w = int(g_.pad);
  s.stride_h = s.stride_w = int(g_.stride);
  return s;
}

CudnnConv& CudnnConvKernels::conv() { return backend_.conv(io_, nhwc_); }

// x: (B, in, h, w) -> y: (B, out, ho, wo) = conv + bias, rectified when fused. Where
// cuDNN's format or type is not y's, it writes into scratch and the epilogue moves it.
void CudnnConvKernels::forward(std::int64_t B, const float* x, const float* weight, const float* bias,
                               float* y) {
  if (B == 0) return;
  const ConvShape s = shape(B);
  const std::int64_t hw_in = g_.h * g_.w, hw_out = g_.ho() * g_.wo();
  const void* x_op = operand(x, in_type_, in_ == Layout::nhwc, B, g_.in, hw_in, Scratch::A);
  const void* w_op = operand(weight, DType::F32, false, g_.out, g_.in, g_.k * g_.k, Scratch::B);
  void* y_op = direct(out_, out_type_)
                   ? static_cast<void*>(y)
                   : backend_.scratch().get(Scratch::C, std::size_t(B * g_.out * hw_out) * dtype_size(io_));
  CudnnConv& c = conv();
  c.forward(s, x_op, w_op, y_op);
  kernel_trace::count_library_call();
  result(y_op, y, out_type_, out_ == Layout::nhwc, B, g_.out, hw_out, bias, fused_relu_, false);
  if (kernel_trace::recording())
    kernel_trace::record(
        {"conv2d fwd", g_.forward_flops(B), [&c, s, x_op, w_op, y_op] { c.forward(s, x_op, w_op, y_op); }});
}

// forward's y and, in the same cuDNN graph, the per-channel sums of y and y^2 into
// sums and sums + out; false where the graph API has no engine its rules allow for
// this shape (then not asked again at this batch size, unless it was asked while the
// step was captured, when no fused plan is made): the sums were zeroed, and y may
// hold a failed first run's part, which forward then writes over.
bool CudnnConvKernels::forward_stats(std::int64_t B, const float* x, const float* weight, float* y,
                                     float* sums) {
  if (B == 0 || !has_forward_stats() || stats_declined_.count(B)) return false;
  const ConvShape s = shape(B);
  const std::int64_t hw_in = g_.h * g_.w;
  const void* x_op = operand(x, in_type_, in_ == Layout::nhwc, B, g_.in, hw_in, Scratch::A);
  const void* w_op = operand(weight, DType::F32, false, g_.out, g_.in, g_.k * g_.k, Scratch::B);
  float* sum = sums;
  float* sqsum = sums + g_.out;
  CudnnConv& c = conv();
  if (!c.forward_stats(s, x_op, w_op, y, nullptr, nullptr, sum, sqsum)) {
    if (!capturing(backend_.stream())) stats_declined_.insert(B);
    return false;
  }
  kernel_trace::count_library_call();
  if (kernel_trace::recording())
    kernel_trace::record({"conv2d fwd+stats", g_.forward_flops(B), [&c, s, x_op, w_op, y, sum, sqsum] {
                            c.forward_stats(s, x_op, w_op, y, nullptr, nullptr, sum, sqsum);
                          }});
  return true;
}

// forward_stats with the batch norm before applied to x on the way in: scale_shift
// holds its map (scale, then shift: in floats each). Declined as forward_stats is.
bool CudnnConvKernels::forward_stats_after(std::int64_t B, const float* x, const float* scale_shift,
                                           const float* weight, float* y, float* sums) {
  // (Where the weights' gradient's graph is declined, the forward's still runs: backward
  // writes r then, as many passes as without the prologue, and a step captured at its
  // second run at B finds every plan it needs made in the first.)
  if (B == 0 || !has_forward_prologue() || after_declined_.count(B)) return false;
  const ConvShape s = shape(B);
  const void* w_op = operand(weight, DType::F32, false, g_.out, g_.in, g_.k * g_.k, Scratch::B);
  const float* scale = scale_shift;
  const float* shift = scale_shift + g_.in;
  float* sum = sums;
  float* sqsum = sums + g_.out;
  CudnnConv& c = conv();
  if (!c.forward_stats(s, x, w_op, y, scale, shift, sum, sqsum)) {
    if (!capturing(backend_.stream())) after_declined_.insert(B);
    return false;
  }
  kernel_trace::count_library_call();
  if (kernel_trace::recording())
    kernel_trace::record(
        {"conv2d fwd+bn+stats", g_.forward_flops(B), [&c, s, x, w_op, y, scale, shift, sum, sqsum] {
           c.forward_stats(s, x, w_op, y, scale, shift, sum, sqsum);
         }});
  return true;
}

// backward_weights on relu(x scale + shift), never stored: cuDNN's wgrad with the same
// prologue, into scratch and added (or moved) into dweight as backward_weights does.
bool CudnnConvKernels::backward_weights_after(std::int64_t B, const float* x, const float* scale_shift,
                                              const float* dy, float* dweight, bool accumulate) {
  dy_narrowed_ = nullptr;
  if (B == 0 || !has_forward_prologue() || wgrad_declined_.count(B)) return false;
  const ConvShape s = shape(B);
  const std::int64_t kk = g_.k * g_.k, nw = g_.out * g_.in * kk, hw_out = g_.ho() * g_.wo();
  const void* dy_op = operand(dy, out_type_, out_ == Layout::nhwc, B, g_.out, hw_out, Scratch::B);
  void* dw_op = backend_.scratch().get(Scratch::C, std::size_t(nw) * dtype_size(io_));
  const float* scale = scale_shift;
  const float* shift = scale_shift + g_.in;
  CudnnConv& c = conv();
  if (!c.backward_filter_after(s, x, dy_op, dw_op, scale, shift)) {
    if (!capturing(backend_.stream())) wgrad_declined_.insert(B);
    return false;
  }
  kernel_trace::count_library_call();
  result(dw_op, dweight, DType::F32, false, g_.out, g_.in, kk, nullptr, false, accumulate);
  if (kernel_trace::recording())
    kernel_trace::record(
        {"conv2d bwd_weights+bn", g_.forward_flops(B), [&c, s, x, dy_op, dw_op, scale, shift] {
           c.backward_filter_after(s, x, dy_op, dw_op, scale, shift);
         }});
  if (dy_op != dy) dy_narrowed_ = dy;
  return true;
}

// backward_data's dx (written) through the mask x scale_shift[c] + scale_shift[in + c] > 0,
// and the sums of dx and of dx (x - mean) per channel into sums and sums + in, in one
// cuDNN graph. x and dx as has_forward_prologue has them (the layer's narrow
// channels-last tensors, as they are). Declined as forward_stats is: then the caller
// runs backward_data, and dy's copy for it is made again.
bool CudnnConvKernels::backward_data_sums(std::int64_t B, const float* dy, const float* weight,
                                          const float* x, const float* scale_shift, const float* mean,
                                          float* dx, float* sums) {
  // (declined at once: dy's copy, if any, stays there for backward_data)
  if (B == 0 || !has_backward_data_sums() || dgrad_declined_.count(B)) return false;
  const bool reuse_dy = dy_narrowed_ == dy;
  dy_narrowed_ = nullptr;
  const ConvShape s = shape(B);
  const std::int64_t hw_out = g_.ho() * g_.wo();
  Scratch& scratch = backend_.scratch();
  // Right after backward weights on the same dy, slot B still holds its copy.
  const void* dy_op = reuse_dy ? scratch.get(Scratch::B, std::size_t(B * g_.out * hw_out) * dtype_size(io_))
                               : operand(dy, out_type_, out_ == Layout::nhwc, B, g_.out, hw_out, Scratch::B);
  const void* w_op = operand(weight, DType::F32, false, g_.out, g_.in, g_.k * g_.k, Scratch::A);
  const float* scale = scale_shift;
  const float* shift = scale_shift + g_.in;
  float* sum = sums;
  float* centred_sum = sums + g_.in;
  CudnnConv& c = conv();
  if (!c.backward_data_sums(s, w_op, dy_op, dx, x, scale, shift, mean, sum, centred_sum)) {
    if (!capturing(backend_.stream())) dgrad_declined_.insert(B);
    if (dy_op != dy) dy_narrowed_ = dy;  // slot B still holds dy's copy for backward_data
    return false;
  }
  kernel_trace::count_library_call();
  if (kernel_trace::recording())
    kernel_trace::record({"conv2d bwd_data+bn", g_.forward_flops(B),
                          [&c, s, w_op, dy_op, dx, x, scale, shift, mean, sum, centred_sum] {
                            c.backward_data_sums(s, w_op, dy_op, dx, x, scale, shift, mean, sum, centred_sum);
                          }});
  return true;
}

// dweight (out, in, k, k) += (or =) corr(x, dy); dbias (out) += (or =) sum dy. fp32
// NCHW results accumulate in cuDNN (beta = 1, or 0 to write); narrow or KRSC ones are
// computed into scratch and added (or widened, moved).
void CudnnConvKernels::backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight,
                                        float* dbias, bool accumulate) {
  dy_narrowed_ = nullptr;
  const std::int64_t kk = g_.k * g_.k, nw = g_.out * g_.in * kk;
  if (B == 0) {
    if (!accumulate) {
      CUDA_CHECK(cudaMemsetAsync(dweight, 0, std::size_t(nw) * sizeof(float), backend_.stream()));
      if (dbias)
        CUDA_CHECK(cudaMemsetAsync(dbias, 0, std::size_t(g_.out) * sizeof(float), backend_.stream()));
    }
    return;
  }
  const ConvShape s = shape(B);
  const std::int64_t hw_in = g_.h * g_.w, hw_out = g_.ho() * g_.wo();
  const void* x_op = operand(x, in_type_, in_ == Layout::nhwc, B, g_.in, hw_in, Scratch::A);
  const void* dy_op = operand(dy, out_type_, out_ == Layout::nhwc, B, g_.out, hw_out, Scratch::B);
  CudnnConv& c = conv();
  if (io_ == DType::F32 && !nhwc_) {
    const float beta = accumulate ? 1.0f : 0.0f;
    c.backward_filter(s, x_op, dy_op, dweight, 1.0f, beta);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({"conv2d bwd_weights", g_.forward_flops(B), [&c, s, x_op, dy_op, dweight, beta] {
                              c.backward_filter(s, x_op, dy_op, dweight, 1.0f, beta);
                            }});
  } else {
    void* dw_op = backend_.scratch().get(Scratch::C, std::size_t(nw) * dtype_size(io_));
    c.backward_filter(s, x_op, dy_op, dw_op);
    kernel_trace::count_library_call();
    result(dw_op, dweight, DType::F32, false, g_.out, g_.in, kk, nullptr, false, accumulate);
    if (kernel_trace::recording())
      kernel_trace::record({"conv2d bwd_weights", g_.forward_flops(B),
                            [&c, s, x_op, dy_op, dw_op] { c.backward_filter(s, x_op, dy_op, dw_op); }});
  }
  if (dy_op != dy) dy_narrowed_ = dy;
  if (dbias) bias_grad(dy, dbias, B, g_.out, hw_out, accumulate, out_ == Layout::nhwc, backend_.stream());
}

// dx (B, in, h, w) = (or +=) conv_transpose(dy, weight); results in another format or
// type moved or widened from scratch (and added there, fp32 only).
void CudnnConvKernels::backward_data(std::int64_t B, const float* dy, const float* weight, float* dx,
                                     bool accumulate) {
  DDP_REQUIRE(!accumulate || accumulates_input_grad(), "cuDNN backward data: cannot add to this dx");
  const bool reuse_dy = dy_narrowed_ == dy;
  dy_narrowed_ = nullptr;
  if (B == 0) return;
  Scratch& scratch = backend_.scratch();
  const ConvShape s = shape(B);
  const std::int64_t hw_in = g_.h * g_.w, hw_out = g_.ho() * g_.wo();
  // Right after backward weights on the same dy, slot B still holds its copy.
  const void* dy_op = reuse_dy ? scratch.get(Scratch::B, std::size_t(B * g_.out * hw_out) * dtype_size(io_))
                               : operand(dy, out_type_, out_ == Layout::nhwc, B, g_.out, hw_out, Scratch::B);
  const void* w_op = operand(weight, DType::F32, false, g_.out, g_.in, g_.k * g_.k, Scratch::A);
  void* dx_op = direct(in_, in_type_)
                    ? static_cast<void*>(dx)
                    : scratch.get(Scratch::C, std::size_t(B * g_.in * hw_in) * dtype_size(io_));
  // Written as it is: cuDNN blends with what dx holds (beta = 1) where it adds.
  const float beta = accumulate && dx_op == dx ? 1.0f : 0.0f;
  CudnnConv& c = conv();
  c.backward_data(s, w_op, dy_op, dx_op, 1.0f, beta);
  kernel_trace::count_library_call();
  result(dx_op, dx, in_type_, in_ == Layout::nhwc, B, g_.in, hw_in, nullptr, false,
         accumulate && dx_op != dx);
  if (kernel_trace::recording())
    kernel_trace::record({"conv2d bwd_data", g_.forward_flops(B), [&c, s, w_op, dy_op, dx_op, beta] {
                            c.backward_data(s, w_op, dy_op, dx_op, 1.0f, beta);
                          }});
}

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(cudaStream_t stream) {
  return std::make_unique<CudaBackend>(stream);
}

}  // namespace ddp::cuda
