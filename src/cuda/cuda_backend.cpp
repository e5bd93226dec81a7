#include "cuda/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cudnn.h>

#include <string>
#include <vector>

#include "cuda/conv.hpp"
#include "cuda/conv_epilogue.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/dtype.hpp"
#include "cuda/gemm.hpp"
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

// DDP_CUDNN_NARROW=1: bf16/fp16 convolutions on cuDNN's own bf16/fp16 kernels rather
// than on rounded operands in fp32 (see CudnnConvKernels).
bool narrow_convolutions() {
  static const bool on = env_flag("DDP_CUDNN_NARROW");
  return on;
}

// DDP_CUDNN_BENCHMARK=1: cuDNN times its algorithms for each convolution shape at
// first use (cudnnFind...) and the fastest deterministic one is taken, as PyTorch's
// cudnn.benchmark does; timings can then choose differently in another run, so two
// runs, or a run and its resume, need not repeat bit for bit. Unset: cuDNN's
// heuristics, the same choice every run.
CudnnConv::Search convolution_search() {
  static const bool on = env_flag("DDP_CUDNN_BENCHMARK");
  return on ? CudnnConv::Search::Benchmark : CudnnConv::Search::Heuristic;
}

class CudaBackend;

// bf16/fp16 convolutions round their operands (x, w, dy) to the narrow type's values
// and run cuDNN's fp32 kernels: bf16 operands, fp32 products and sums, fp32 results,
// as the host's oneDNN path. cuDNN's own bf16 kernels (the legacy API stores y, dx
// and dw in bf16) were measured here on an H100 at 7 to 15 times the fp32 forward
// time in these NCHW shapes, and 6 to 19% off the host's one-step gradients (the
// rounded outputs move relu and max-pool decisions); DDP_CUDNN_NARROW=1 runs them.
// The GEMMs (cuBLAS) use the tensor cores either way: bf16/fp16 operands, fp32 C.
class CudnnConvKernels final : public ConvKernels {
 public:
  CudnnConvKernels(CudaBackend& backend, const ConvGeometry& g);
  void configure(Precision precision, bool fused_relu, Layout in, Layout out) override;
  // cuDNN runs NCHW here: the blocked layouts are the host backend's.
  Layout native_input_layout() override { return Layout::nchw; }
  Layout native_output_layout() override { return Layout::nchw; }
  void forward(std::int64_t B, const float* x, const float* weight, const float* bias, float* y) override;
  void backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight, float* dbias,
                        bool accumulate) override;
  void backward_data(std::int64_t B, const float* dy, const float* weight, float* dx) override;

 private:
  ConvShape shape(std::int64_t B) const;
  CudnnConv& conv();

  // An operand at the configured precision: narrowed into scratch (cuDNN's narrow
  // kernels), rounded in fp32 (the default), or `from` itself (fp32).
  const void* operand(const float* from, std::size_t n, Scratch::Slot slot);

  CudaBackend& backend_;
  ConvGeometry g_;
  DType dtype_ = DType::F32;  // the operands' precision
  DType io_ = DType::F32;     // what cuDNN reads and writes: dtype_ with DDP_CUDNN_NARROW, else fp32
  bool fused_relu_ = false;
  const float* dy_narrowed_ = nullptr;  // backward weights left this dy's bf16/fp16 copy in slot B
};

class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(cudaStream_t stream) : stream_(stream), gemm_(stream), scratch_(stream) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int cublas_version = 0;
    CUBLAS_CHECK(cublasGetVersion(gemm_.handle(), &cublas_version));
    const std::size_t cudnn_version = cudnnGetVersion();
    name_ = "cuBLAS " + std::to_string(cublas_version / 10000) + "." +
            std::to_string(cublas_version / 100 % 100) + " + cuDNN " + std::to_string(cudnn_version / 10000) +
            "." + std::to_string(cudnn_version / 100 % 100) + " on GPU " + std::to_string(device) + ", " +
            prop.name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  }

  std::string name() const override { return name_; }
  std::string precision_text(Precision p) const override {
    switch (p) {
      case Precision::fp32:
        return "fp32 (cuBLAS/cuDNN fp32 kernels, no TF32)";
      case Precision::bf16:
        return narrow_convolutions() ? "bf16 (cuBLAS and cuDNN bf16 kernels, fp32 accumulation)"
                                     : "bf16 (cuBLAS bf16 tensor cores, fp32 accumulation; convolutions on "
                                       "bf16-rounded operands in fp32)";
      case Precision::fp16:
        return narrow_convolutions() ? "fp16 (cuBLAS and cuDNN fp16 kernels, fp32 accumulation)"
                                     : "fp16 (cuBLAS fp16 tensor cores, fp32 accumulation; convolutions on "
                                       "fp16-rounded operands in fp32)";
    }
    return "?";
  }
  bool device_memory() const override { return true; }

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, Precision precision) override {
    if (m == 0 || n == 0) return;
    const DType t = dtype_of(precision);
    const std::size_t a_size = std::size_t(trans_a ? k : m) * lda,
                      b_size = std::size_t(trans_b ? n : k) * ldb;
    const void* a_op = narrowed(a, a_size, t, scratch_, Scratch::A, stream_);
    const void* b_op = narrowed(b, b_size, t, scratch_, Scratch::B, stream_);
    gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({std::string("gemm ") + precision_name(precision) + " " + std::to_string(m) + "x" +
                                std::to_string(n) + "x" + std::to_string(k),
                            2.0 * m * n * k, [=] {
                              gemm_(trans_a, trans_b, m, n, k, alpha, a_op, lda, b_op, ldb, beta, c, ldc, t);
                            }});
  }

  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& geometry) override {
    return std::make_unique<CudnnConvKernels>(*this, geometry);
  }

  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  cudaStream_t stream() const { return stream_; }
  Scratch& scratch() { return scratch_; }
  // One cuDNN handle and plan cache per operand type, made on first use.
  CudnnConv& conv(DType t) {
    auto& c = convs_[int(t)];
    if (!c) c = std::make_unique<CudnnConv>(stream_, t, convolution_search());
    return *c;
  }

 private:
  cudaStream_t stream_;
  CublasGemm gemm_;
  Scratch scratch_;
  std::unique_ptr<CudnnConv> convs_[3];
  std::string name_;
};

CudnnConvKernels::CudnnConvKernels(CudaBackend& backend, const ConvGeometry& g) : backend_(backend), g_(g) {}

void CudnnConvKernels::configure(Precision precision, bool fused_relu, Layout in, Layout out) {
  DDP_REQUIRE(in == Layout::nchw && out == Layout::nchw, "cuDNN convolutions here take NCHW tensors only");
  dtype_ = dtype_of(precision);
  io_ = narrow_convolutions() ? dtype_ : DType::F32;
  fused_relu_ = fused_relu;
}

const void* CudnnConvKernels::operand(const float* from, std::size_t n, Scratch::Slot slot) {
  Scratch& scratch = backend_.scratch();
  if (io_ != DType::F32) return narrowed(from, n, io_, scratch, slot, backend_.stream());
  return rounded(from, n, dtype_, scratch, slot, backend_.stream());
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

CudnnConv& CudnnConvKernels::conv() { return backend_.conv(io_); }

// x: (B, in, h, w) -> y: (B, out, ho, wo) = conv + bias, rectified when fused. With
// DDP_CUDNN_NARROW, cuDNN writes y narrow into scratch and the epilogue widens it.
void CudnnConvKernels::forward(std::int64_t B, const float* x, const float* weight, const float* bias,
                               float* y) {
  if (B == 0) return;
  const cudaStream_t stream = backend_.stream();
  Scratch& scratch = backend_.scratch();
  const ConvShape s = shape(B);
  const std::size_t nx = std::size_t(B * g_.in * g_.h * g_.w), nw = std::size_t(g_.out * g_.in * g_.k * g_.k),
                    ny = std::size_t(B * g_.out * g_.ho() * g_.wo());
  const void* x_op = operand(x, nx, Scratch::A);
  const void* w_op = operand(weight, nw, Scratch::B);
  void* y_op = io_ == DType::F32 ? static_cast<void*>(y) : scratch.get(Scratch::C, ny * dtype_size(io_));
  CudnnConv& c = conv();
  c.forward(s, x_op, w_op, y_op);
  kernel_trace::count_library_call();
  bias_relu(y_op, io_, y, bias, B, g_.out, g_.ho() * g_.wo(), fused_relu_, stream);
  if (kernel_trace::recording())
    kernel_trace::record(
        {"conv2d fwd", g_.forward_flops(B), [&c, s, x_op, w_op, y_op] { c.forward(s, x_op, w_op, y_op); }});
}

// dweight (out, in, k, k) += (or =) corr(x, dy); dbias (out) += (or =) sum dy. fp32
// results accumulate in cuDNN (beta = 1, or 0 to write); narrow ones are computed into
// scratch and added (or widened).
void CudnnConvKernels::backward_weights(std::int64_t B, const float* x, const float* dy, float* dweight,
                                        float* dbias, bool accumulate) {
  dy_narrowed_ = nullptr;
  if (B == 0) {
    if (!accumulate) {
      CUDA_CHECK(cudaMemsetAsync(dweight, 0, std::size_t(g_.out * g_.in * g_.k * g_.k) * sizeof(float),
                                 backend_.stream()));
      if (dbias) CUDA_CHECK(cudaMemsetAsync(dbias, 0, std::size_t(g_.out) * sizeof(float), backend_.stream()));
    }
    return;
  }
  const cudaStream_t stream = backend_.stream();
  Scratch& scratch = backend_.scratch();
  const ConvShape s = shape(B);
  const std::size_t nx = std::size_t(B * g_.in * g_.h * g_.w), nw = std::size_t(g_.out * g_.in * g_.k * g_.k),
                    ny = std::size_t(B * g_.out * g_.ho() * g_.wo());
  const void* x_op = operand(x, nx, Scratch::A);
  const void* dy_op = operand(dy, ny, Scratch::B);
  CudnnConv& c = conv();
  if (io_ == DType::F32) {
    const float beta = accumulate ? 1.0f : 0.0f;
    c.backward_filter(s, x_op, dy_op, dweight, 1.0f, beta);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record({"conv2d bwd_weights", g_.forward_flops(B), [&c, s, x_op, dy_op, dweight, beta] {
                              c.backward_filter(s, x_op, dy_op, dweight, 1.0f, beta);
                            }});
  } else {
    void* dw_op = scratch.get(Scratch::C, nw * dtype_size(io_));
    c.backward_filter(s, x_op, dy_op, dw_op);
    kernel_trace::count_library_call();
    ::ddp::cuda::accumulate(dw_op, io_, dweight, nw, accumulate, stream);
    if (kernel_trace::recording())
      kernel_trace::record({"conv2d bwd_weights", g_.forward_flops(B),
                            [&c, s, x_op, dy_op, dw_op] { c.backward_filter(s, x_op, dy_op, dw_op); }});
  }
  if (dtype_ != DType::F32) dy_narrowed_ = dy;
  if (dbias) bias_grad(dy, dbias, B, g_.out, g_.ho() * g_.wo(), accumulate, stream);
}

// dx (B, in, h, w) = conv_transpose(dy, weight); narrow results widened from scratch.
void CudnnConvKernels::backward_data(std::int64_t B, const float* dy, const float* weight, float* dx) {
  const bool reuse_dy = dy_narrowed_ == dy;
  dy_narrowed_ = nullptr;
  if (B == 0) return;
  const cudaStream_t stream = backend_.stream();
  Scratch& scratch = backend_.scratch();
  const ConvShape s = shape(B);
  const std::size_t nx = std::size_t(B * g_.in * g_.h * g_.w), nw = std::size_t(g_.out * g_.in * g_.k * g_.k),
                    ny = std::size_t(B * g_.out * g_.ho() * g_.wo());
  // Right after backward weights on the same dy, slot B still holds its bf16/fp16 copy.
  const void* dy_op = reuse_dy ? scratch.get(Scratch::B, ny * dtype_size(io_)) : operand(dy, ny, Scratch::B);
  const void* w_op = operand(weight, nw, Scratch::A);
  void* dx_op = io_ == DType::F32 ? static_cast<void*>(dx) : scratch.get(Scratch::C, nx * dtype_size(io_));
  CudnnConv& c = conv();
  c.backward_data(s, w_op, dy_op, dx_op);
  kernel_trace::count_library_call();
  if (io_ != DType::F32) convert_to_f32(dx_op, io_, dx, nx, stream);
  if (kernel_trace::recording())
    kernel_trace::record({"conv2d bwd_data", g_.forward_flops(B),
                          [&c, s, w_op, dy_op, dx_op] { c.backward_data(s, w_op, dy_op, dx_op); }});
}

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(cudaStream_t stream) {
  return std::make_unique<CudaBackend>(stream);
}

}  // namespace ddp::cuda
