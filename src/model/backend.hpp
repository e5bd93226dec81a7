#pragma once
// The backend seam: the heavy operations of the layers (GEMMs and convolutions)
// behind one interface, chosen once at start-up. The CPU build runs oneDNN on the
// host (src/model/onednn/: its blocked layouts, bf16 kernels or emulation and fused
// relu stay in there); the CUDA build runs cuBLAS and cuDNN on the rank's stream,
// which is Kokkos's own, so library calls and Kokkos kernels are ordered without a
// host wait (src/cuda/cuda_backend.cpp: handles and workspaces owned there).
//
// Layers hand it raw pointers into Kokkos's default memory space and hold no
// library types. No Kokkos here either: the CUDA glue implements this header with
// nvcc alone.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/gemm.hpp"  // GemmSteps
#include "model/precision.hpp"

namespace ddp {

// The floats a row-major matrix of `rows` rows of `cols` with leading dimension `ld`
// spans from its first element: (rows - 1) ld + cols, not rows ld. A GEMM operand
// that is a block of a wider matrix (an attention head's columns) ends before the
// wider one's last row does; what a backend copies (to round or narrow it) is this.
constexpr std::int64_t matrix_span(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
}

// The floats a batch of such matrices spans from the first one's first element:
// `groups` groups `group_step` apart of `batch` matrices `step` apart (batched GEMMs'
// operands), to the end of the last one.
constexpr std::int64_t batch_span(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                                  std::int64_t step, std::int64_t groups = 1, std::int64_t group_step = 0) {
  return (groups - 1) * group_step + (batch - 1) * step + matrix_span(rows, cols, ld);
}

// How an image tensor (B, C, H, W) lies in its buffer. Tensors are NCHW except
// from a convolution (or resblock) to the next layer that reads the layout the
// backend's kernels chose: oneDNN's channel blocks on this CPU (nChw8c with AVX2,
// nChw16c with AVX-512), or channels-last (cuDNN's tensor-core layout, or oneDNN's
// under DDP_CONV_LAYOUT=nhwc): a convolution, resblock, max-pool or global pool,
// through relu, tanh and batch norm (Model::plan_layouts), so no reorder runs there.
enum class Layout {
  nchw,     // PyTorch's
  nChw8c,   // (B, ceil(C/8), H, W, 8), padding channels zero
  nChw16c,  // (B, ceil(C/16), H, W, 16), padding channels zero
  nhwc,     // (B, H, W, C): PyTorch's channels_last
};
// Channels per block: 8 or 16 for the blocked layouts, 1 for nchw and nhwc (no padding).
constexpr int channel_block(Layout layout) {
  return layout == Layout::nChw16c ? 16 : layout == Layout::nChw8c ? 8 : 1;
}
constexpr const char* layout_name(Layout layout) {
  return layout == Layout::nChw16c  ? "nChw16c"
         : layout == Layout::nChw8c ? "nChw8c"
         : layout == Layout::nhwc   ? "nhwc"
                                    : "nchw";
}

// One convolution layer: PyTorch's Conv2d with a square kernel, symmetric zero
// padding, no dilation or groups. Weight (out, in, k, k), bias (out).
struct ConvGeometry {
  std::int64_t in = 1, h = 1, w = 1;  // input sample (C_in, H, W)
  std::int64_t out = 1, k = 1, stride = 1, pad = 0;
  bool bias = true;
  std::int64_t ho() const { return (h + 2 * pad - k) / stride + 1; }
  std::int64_t wo() const { return (w + 2 * pad - k) / stride + 1; }
  // Floating-point operations of one forward at batch B (2 per multiply-add); the
  // backward passes cost the same each.
  double forward_flops(std::int64_t B) const { return 2.0 * B * out * ho() * wo() * in * k * k; }
};

// How one side of a convolution lies in its buffers, x and dx (the input side) or y
// and dy (the output side): their layout and their elements' type (fp32, or the
// narrow precision where the model keeps them so: model/elements.hpp).
struct ConvSide {
  Layout layout = Layout::nchw;
  Precision type = Precision::fp32;
};

// The kernels of one convolution layer. Whatever they need per batch size
// (descriptors, primitives, algorithm choices, reorder buffers) is planned on first
// use of that size and kept.
class ConvKernels {
 public:
  virtual ~ConvKernels() = default;

  // Whether the kernels read and write activations of `p`'s narrow type themselves
  // (cuDNN's bf16/fp16 kernels, which read and write that type anyway). Where not,
  // the layer widens a narrow x or dy and narrows y or dx around fp32 sides.
  virtual bool takes_narrow_activations(Precision /*p*/) const { return false; }
  // How the following calls run: the operand precision, a relu fused into forward
  // (y = max(conv + b, 0)), and the two sides. A narrow side only where
  // takes_narrow_activations(precision), and then with no bias, fused relu or
  // accumulated result on it. Drops what was planned when any of it changes.
  virtual void configure(Precision precision, bool fused_relu, ConvSide in, ConvSide out) = 0;
  // The layout the kernels, at the configured precision, read and write anyway in
  // every pass for x and dx (input side), for y and dy (output side): blocked, nhwc,
  // or nchw where they take NCHW or no single layout. Where it is not nchw, the model
  // keeps the activations in it, and no reorder runs on that side.
  virtual Layout native_input_layout() = 0;
  virtual Layout native_output_layout() = 0;

  // y (B, out, ho, wo) = conv(x (B, in, h, w), weight) + bias, rectified if fused.
  // bias is null when the layer has none.
  virtual void forward(std::int64_t B, const float* x, const float* weight, const float* bias, float* y) = 0;
  // dweight (out, in, k, k) += corr(x, dy); dbias (out) += sum of dy over (B, ho, wo)
  // when not null. Accumulates, as PyTorch does; with accumulate off, writes (=) them
  // without reading what they held.
  virtual void backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight, float* dbias,
                                bool accumulate) = 0;
  // dx (B, in, h, w) = conv_transpose(dy (B, out, ho, wo), weight); with accumulate,
  // += (where accumulates_input_grad()).
  virtual void backward_data(std::int64_t B, const float* dy, const float* weight, float* dx,
                             bool accumulate) = 0;
  // Whether backward_data adds to dx as it writes it, on the configured sides.
  virtual bool accumulates_input_grad() const { return false; }
  // The forward with the statistics a batch norm after it needs, in the same pass
  // (cuDNN's "conv -> genstats" graph): y as forward writes it, and sums (2 * out
  // floats): each channel's sum of y over (B, ho, wo), then its sum of y^2, fp32.
  // Where has_forward_stats(): on the configured sides, no bias nor fused relu. It may
  // still decline a shape (cuDNN without an engine for it that its rules allow): false,
  // and what y and sums hold is not to be read: the caller runs forward and the batch
  // norm its own sums. The host's oneDNN has no such pass.
  virtual bool has_forward_stats() const { return false; }
  virtual bool forward_stats(std::int64_t /*B*/, const float* /*x*/, const float* /*weight*/, float* /*y*/,
                             float* /*sums*/) {
    return false;
  }
  // The batch norm before the convolution, and its relu, applied on the way in (cuDNN's
  // "scale-bias-relu -> conv -> genstats"): y = conv(relu(x * scale + shift), weight)
  // and its sums as forward_stats writes them, where x is that batch norm's input (of
  // the input side's layout and type), scale_shift its map (in floats of scale, then
  // in of shift, fp32) and the rectified input is never stored. backward_weights_after
  // is backward_weights on that rectified input, from the same x and map (no bias).
  // Where has_forward_prologue() (with has_forward_stats()); either may still decline
  // a shape: false, and what y, sums or dweight hold is not to be read (the caller
  // writes the rectified input and runs forward_stats or backward_weights on it).
  virtual bool has_forward_prologue() const { return false; }
  virtual bool forward_stats_after(std::int64_t /*B*/, const float* /*x*/, const float* /*scale_shift*/,
                                   const float* /*weight*/, float* /*y*/, float* /*sums*/) {
    return false;
  }
  virtual bool backward_weights_after(std::int64_t /*B*/, const float* /*x*/, const float* /*scale_shift*/,
                                      const float* /*dy*/, float* /*dweight*/, bool /*accumulate*/) {
    return false;
  }
  // The data gradient on the same input, taken back through that batch norm's relu, with
  // the sums its backward needs, in the same pass (cuDNN's "dgrad -> drelu -> dbn" as its
  // runtime fusion has it: the mask and the sums in the convolution's epilogue): dx =
  // conv_transpose(dy, weight) where x * scale + shift > 0, else 0, written (not added),
  // of the input side's layout and type; sums (2 * in floats): each channel's sum of dx
  // over (B, h, w), then its sum of dx (x - mean), mean that batch norm's (in floats,
  // fp32). Where has_backward_data_sums() (with has_forward_prologue()); it may still
  // decline a shape: false, and what dx and sums hold is not to be read (the caller runs
  // backward_data and the batch norm its own sums).
  virtual bool has_backward_data_sums() const { return false; }
  virtual bool backward_data_sums(std::int64_t /*B*/, const float* /*dy*/, const float* /*weight*/,
                                  const float* /*x*/, const float* /*scale_shift*/, const float* /*mean*/,
                                  float* /*dx*/, float* /*sums*/) {
    return false;
  }
  // The bytes the library's kernels hold of their own for calls at batch B on the
  // configured sides (oneDNN: its copies of operands in the layouts and types it
  // wants, its scratchpads), for the start-up memory plan; 0 where unknown before
  // the first call (cuDNN's workspace: the algorithms choose it).
  virtual std::int64_t held_bytes(std::int64_t /*B*/) const { return 0; }
};

// One batch norm's training passes in the vendor's library, on channels-last
// (B, H, W, C) tensors of a narrow type: y = relu?(gamma (x - mean) invstd + beta
// (+ z)) with the batch's mean and biased variance (cuDNN's persistent NHWC batch
// norm in the CUDA build, the kernels PyTorch's AMP runs with channels_last). For
// BatchNorm2d where DDP_CUDNN_BATCHNORM=1 asks for it (model/batchnorm.hpp).
struct BatchNormPass {
  std::int64_t B = 0, C = 0, hw = 0;
  Precision type = Precision::bf16;  // of x, z, y, dy, dx and dz
  bool relu = false;                 // rectified after the batch norm (and the add)
  bool add = false;                  // z added before the relu (ResBlock's shortcut); with relu only
};
class BatchNormKernels {
 public:
  virtual ~BatchNormKernels() = default;
  // Device bytes a training forward keeps for the backward of it (the relu's mask):
  // the `reserve` both calls take, of that size.
  virtual std::size_t reserve_bytes(const BatchNormPass& p) = 0;
  // y from x (and z); running_mean and running_var (C floats) moved by `momentum`
  // toward the batch's mean and unbiased variance, as PyTorch's are; the batch's
  // mean and 1/sqrt(var + eps) written to mean and invstd (C floats) for backward.
  virtual void forward_training(const BatchNormPass& p, const void* x, const void* z, void* y,
                                const float* gamma, const float* beta, float* running_mean,
                                float* running_var, double momentum, double eps, float* mean, float* invstd,
                                void* reserve, std::size_t reserve_size) = 0;
  // The backward of that forward, from its x, y, mean, invstd and reserve: dx (and,
  // with add, dz: dy through the relu's mask, z's gradient) written; dgamma and dbeta
  // (C floats) written, or added to with accumulate.
  virtual void backward(const BatchNormPass& p, const void* x, const void* y, const void* dy, void* dx,
                        void* dz, const float* gamma, const float* beta, float* dgamma, float* dbeta,
                        bool accumulate, double eps, const float* mean, const float* invstd, void* reserve,
                        std::size_t reserve_size) = 0;
};

// Work queued on the backend's stream, captured once as a CUDA graph
// (train.cuda_graph) and replayed there: the same kernels, arguments and pointers.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // One line for logs and --version: "oneDNN 2.6.3 on AVX2", "cuBLAS 13.0 + cuDNN 9.19 on NVIDIA H100 ...".
  virtual std::string name() const = 0;
  // How train.precision runs here, for rank 0's start-up line:
  // "bf16 (oneDNN brg:avx512_core_bf16)", "bf16 (emulated: ...)", "bf16 (cuBLAS/cuDNN ...)".
  virtual std::string precision_text(Precision p) const = 0;
  // Whether convolutions at precision `p` store their results (y, dx, dw) rounded to
  // it, as PyTorch's autocast does (the GPU build's cuDNN bf16/fp16 kernels, unless
  // DDP_CUDNN_NARROW=0), rather than in fp32: tests widen their tolerances by it.
  virtual bool narrow_convolution_results(Precision /*p*/) const { return false; }
  // Why train.precision `p` cannot run here (a GPU without tensor cores for it), or
  // empty: checked at start-up, before any step.
  virtual std::string precision_unsupported(Precision /*p*/) const { return {}; }
  // train.tf32: whether fp32 convolutions and GEMMs may run on TF32 tensor cores
  // (operands rounded to a 10-bit mantissa, products summed in fp32), as PyTorch's
  // allow_tf32. Set at start-up, before the first convolution. Returns why they will
  // not where `allow` cannot be had here (the CPU build; a GPU older than Ampere),
  // else empty; precision_text(fp32) says which arithmetic runs.
  virtual std::string allow_tf32(bool allow) {
    return allow ? "TF32 is a format of NVIDIA's tensor cores; the CPU build computes fp32 in fp32" : "";
  }
  // Whether tensors live in device memory (the CUDA build): communication then
  // takes device buffers.
  virtual bool device_memory() const = 0;

  // C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major.
  // op(A) = A^T when trans_a (A is then stored (k, m)); likewise for B. The operands
  // A and B are taken at `precision`, products accumulate in fp32, C stays fp32.
  virtual void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc, Precision precision) = 0;
  // gemm on operands and a result stored narrow where `stored` says (model/gemm.hpp's
  // GemmStored), where gemm_takes_stored(): the GPU build's cuBLAS reads and writes
  // bf16/fp16 itself. Elsewhere model/gemm.cpp widens and narrows around gemm.
  virtual bool gemm_takes_stored() const { return false; }
  virtual void gemm_stored(bool /*trans_a*/, bool /*trans_b*/, int /*m*/, int /*n*/, int /*k*/,
                           float /*alpha*/, const void* /*a*/, int /*lda*/, const void* /*b*/, int /*ldb*/,
                           float /*beta*/, void* /*c*/, int /*ldc*/, Precision /*precision*/,
                           GemmStored /*stored*/) {}
  // model/gemm.hpp's gemm_epilogue in one call where this backend has the epilogue for
  // these arguments (the GPU build: cuBLASLt's bias, tanh GELU and its gradient):
  // true, and C (and `pre`) written; false, and nothing done: model/gemm.cpp then runs
  // the GEMM and one pass over C. The host has none.
  virtual bool gemm_epilogue(bool /*trans_a*/, bool /*trans_b*/, int /*m*/, int /*n*/, int /*k*/,
                             const void* /*a*/, int /*lda*/, const void* /*b*/, int /*ldb*/, void* /*c*/,
                             int /*ldc*/, Precision /*precision*/, GemmStored /*stored*/,
                             const GemmEpilogue& /*epilogue*/) {
    return false;
  }
  // `batch` such GEMMs at once: C_i = alpha op(A_i) op(B_i) + beta C_i with
  // A_i = a + i stride_a, B_i = b + i stride_b, C_i = c + i stride_c (floats), the
  // C_i apart: attention's per-head products, whose heads are columns of one matrix.
  // Here a loop of gemm (oneDNN's batched matmul ran those shapes no faster on the
  // host); the GPU build's one cuBLAS strided-batched call.
  virtual void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                            int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b,
                            float beta, float* c, int ldc, std::int64_t stride_c, int batch,
                            Precision precision) {
    for (int i = 0; i < batch; ++i)
      gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
           c + i * stride_c, ldc, precision);
  }

  // groups x batch GEMMs of one shape (model/gemm.hpp's gemm_batched_groups). Here a
  // loop of gemm_batched over the groups; the GPU build's narrows each operand's whole
  // span once and makes one strided-batched call per group or per item, the fewer.
  virtual void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                                   const float* a, int lda, const float* b, int ldb, float beta, float* c,
                                   int ldc, int batch, GemmSteps item, int groups, GemmSteps group,
                                   Precision precision) {
    for (int g = 0; g < groups; ++g)
      gemm_batched(trans_a, trans_b, m, n, k, alpha, a + g * group.a, lda, item.a, b + g * group.b, ldb,
                   item.b, beta, c + g * group.c, ldc, item.c, batch, precision);
  }

  // GEMM operands narrowed once where several products read them (NarrowedOnce,
  // model/tensor.hpp): attention's qkv, a layer's output gradient. narrow_copy_floats:
  // the floats of room the copy of n floats at precision p takes, 0 where this backend
  // keeps no copies (the host: oneDNN narrows inside its kernels; fp32 anywhere).
  // narrow_copy: n floats at `from` narrowed into `to`; until forget_narrow_copy(from),
  // a GEMM operand at p lying within them is read from the copy, not narrowed again,
  // so the floats must not change meanwhile.
  virtual std::int64_t narrow_copy_floats(std::int64_t /*n*/, Precision /*p*/) const { return 0; }
  virtual void narrow_copy(const float* /*from*/, std::int64_t /*n*/, Precision /*p*/, float* /*to*/) {}
  virtual void forget_narrow_copy(const float* /*from*/) {}

  // Fused self-attention (flash attention's algorithm: O(T) memory, no (T, T)
  // matrix), where the backend has it for these arguments: the GPU build at bf16 with
  // head sizes 16, 32, 64, 128 (cuda/flash_attention.hpp for the layouts). The host
  // has none: false, and nothing done.
  struct FusedAttention {
    std::int64_t B, T, heads, head_size;
    bool causal;
  };
  virtual bool has_fused_attention(std::int64_t /*head_size*/, Precision /*p*/) const { return false; }
  // o (B, T, d) and stats (B, heads, T, 2: each query's max score and 1 / sum) from
  // qkv (B, T, 3d).
  virtual void fused_attention_forward(const FusedAttention& /*a*/, const float* /*qkv*/, float* /*o*/,
                                       float* /*stats*/) {}
  // dqkv (B, T, 3d), written, from forward's qkv, o and stats and dO (B, T, d); delta
  // (B, heads, T) is scratch.
  virtual void fused_attention_backward(const FusedAttention& /*a*/, const float* /*qkv*/, const float* /*o*/,
                                        const float* /*d_o*/, const float* /*stats*/, float* /*delta*/,
                                        float* /*dqkv*/) {}

  virtual std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& geometry) = 0;

  // Batch norm's training passes in the vendor's library, or null where the backend
  // has none (the host: oneDNN's would not read the model's layouts as they are).
  virtual BatchNormKernels* batch_norm() { return nullptr; }
  // Whether BatchNorm2d takes them where it can unless told otherwise: in the CUDA
  // build when DDP_CUDNN_BATCHNORM=1 (off by default: not yet timed in the step).
  virtual bool batch_norm_in_library() const { return false; }

  // Wait until the work queued so far has finished (a no-op on the host): for
  // timings and for host code that reads results.
  virtual void synchronize() = 0;

  // Why queued work cannot be captured as a CUDA graph here, or empty.
  virtual std::string graphs_unsupported() const { return "the CPU build runs no CUDA graphs"; }
  // What `record` queues on the backend's stream (and on streams that join it),
  // captured into a graph instead of run: nothing runs until replay(). `record` must
  // not wait for the device nor allocate device memory; a CUDA call that cannot be
  // captured ends the run with one line naming it. Only where graphs_unsupported()
  // is empty.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& /*record*/) { return nullptr; }
};

// The narrow copies a backend keeps (ComputeBackend::narrow_copy), and where an
// operand lies within one. A layer's call holds a few at once.
class NarrowCopies {
 public:
  // n floats at `from` (not overlapping another copy at p) and their copy at p,
  // `element_bytes` an element.
  void add(const float* from, std::int64_t n, Precision p, const void* copy, std::size_t element_bytes);
  void forget(const float* from);
  // The copy's elements of the `floats` floats at `at`, where they lie within one copy
  // at precision p; else null.
  const void* find(const float* at, std::int64_t floats, Precision p) const;

 private:
  struct Copy {
    const float* from;
    std::int64_t n;
    Precision p;
    const char* copy;
    std::size_t element_bytes;
  };
  std::vector<Copy> copies_;
};

// A captured graph holds device pointers: it stays valid until a block that existed
// when it was captured is freed. From watch_device_memory() on, the blocks of device
// (and pinned) memory Kokkos's views take are numbered in the order of allocation
// (through its tools interface), and their releases kept until taken.
void watch_device_memory();
// The number of the last block allocated (0: none yet).
std::uint64_t device_allocations();
// The numbers of the blocks freed since the last call. The CUDA glue's own
// workspaces report a release as device_block_freed(what), number 0: older than any
// graph.
std::vector<std::uint64_t> take_device_frees();
void device_block_freed(const std::string& what);
// What was allocated or freed since take_device_frees, for an error line: the
// blocks' labels (Kokkos's view labels, or what device_block_freed was told), the
// first few, e.g. "'Conv2d::dx' allocated, the cuDNN workspace freed".
std::string device_memory_changes();

// The backend of this process, made on first use (after Kokkos::initialize) and
// released when Kokkos finalizes: oneDNN in the CPU build, cuBLAS/cuDNN on Kokkos's
// CUDA stream in the CUDA build.
ComputeBackend& compute_backend();

// Tests: `backend` becomes the process's (made first if none was), and the one it
// replaces comes back, to be put back the same way before Kokkos finalizes.
std::unique_ptr<ComputeBackend> swap_compute_backend(std::unique_ptr<ComputeBackend> backend);

}  // namespace ddp
