#include "model/onednn/onednn_backend.hpp"

#include <cstdlib>
#include <dnnl.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/check.hpp"
#include "model/kernel_trace.hpp"
#include "model/onednn/dnnl_engine.hpp"

namespace ddp {

namespace {

using dnnl::memory;

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success)
    DDP_FATAL("oneDNN sgemm (" << m << "x" << n << "x" << k << ") failed with status " << status);
}

// A thread's bf16 operand buffers, shared by all its shapes' GEMMs (each runs to its
// end before the next starts): grown only, to the largest spans met. (One pair per
// shape, as before, grew with the shapes: attention's blocks make a shape each.)
struct Bf16Scratch {
  struct Buffer {
    std::unique_ptr<void, void (*)(void*)> data{nullptr, std::free};
    std::size_t bytes = 0;
    void* at_least(std::size_t n) {
      if (n > bytes) {
        data.reset(std::aligned_alloc(64, (n + 63) / 64 * 64));
        DDP_REQUIRE(data != nullptr, "cannot allocate " << n << " bytes of bf16 GEMM operands");
        bytes = n;
      }
      return data.get();
    }
  };
  Buffer a, b;
};

Bf16Scratch& bf16_scratch() {
  thread_local Bf16Scratch scratch;
  return scratch;
}

// A bf16 GEMM for one shape: reorders of A and B from fp32 into bf16 buffers of the
// same layout (the thread's Bf16Scratch), and a matmul with an fp32 destination.
struct Bf16Gemm {
  memory a32, b32, a16, b16, c32;
  dnnl::reorder to16_a, to16_b;
  dnnl::matmul matmul;

  // The operand (rows, cols) seen by matmul, stored row-major with leading
  // dimension ld, transposed when `trans`.
  static memory::desc operand(int rows, int cols, int ld, bool trans, memory::data_type t) {
    return trans ? memory::desc({rows, cols}, t, {1, ld}) : memory::desc({rows, cols}, t, {ld, 1});
  }

  Bf16Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, int lda, int ldb, float beta,
           int ldc) {
    dnnl::engine& eng = dnnl_engine();
    const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
    const memory::desc a32_md = operand(m, k, lda, trans_a, f32), b32_md = operand(k, n, ldb, trans_b, f32);
    const memory::desc a16_md = operand(m, k, lda, trans_a, bf16), b16_md = operand(k, n, ldb, trans_b, bf16);
    const memory::desc c_md({m, n}, f32, {ldc, 1});
    a32 = memory(a32_md, eng, DNNL_MEMORY_NONE);
    b32 = memory(b32_md, eng, DNNL_MEMORY_NONE);
    c32 = memory(c_md, eng, DNNL_MEMORY_NONE);
    a16 = memory(a16_md, eng, DNNL_MEMORY_NONE);
    b16 = memory(b16_md, eng, DNNL_MEMORY_NONE);
    to16_a = dnnl::reorder(a32, a16);
    to16_b = dnnl::reorder(b32, b16);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    matmul = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a16_md, b16_md, c_md), attr, eng));
  }

  void run(const float* a, const float* b, float* c) {
    dnnl::stream& s = dnnl_stream();
    a32.set_data_handle(const_cast<float*>(a));
    b32.set_data_handle(const_cast<float*>(b));
    c32.set_data_handle(c);
    Bf16Scratch& scratch = bf16_scratch();
    a16.set_data_handle(scratch.a.at_least(a16.get_desc().get_size()));
    b16.set_data_handle(scratch.b.at_least(b16.get_desc().get_size()));
    to16_a.execute(s, a32, a16);
    to16_b.execute(s, b32, b16);
    matmul.execute(s, {{DNNL_ARG_SRC, a16}, {DNNL_ARG_WEIGHTS, b16}, {DNNL_ARG_DST, c32}});
    s.wait();
  }
};

// Per thread (training and validation may run on different threads): primitives
// are built once per shape; their bf16 buffers are the thread's Bf16Scratch.
Bf16Gemm& bf16_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, int lda, int ldb,
                    float beta, int ldc) {
  using Key = std::tuple<bool, bool, int, int, int, float, int, int, float, int>;
  thread_local std::map<Key, Bf16Gemm> cache;
  const Key key{trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc};
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache
             .emplace(std::piecewise_construct, std::forward_as_tuple(key),
                      std::forward_as_tuple(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc))
             .first;
  return it->second;
}

// Emulated precision p: the operands rounded to p's values in fp32 scratch, then
// sgemm. Every product of two bf16 or fp16 values is exact in fp32, so this gives
// the sums of p operands with fp32 accumulation (fp16's overflow to inf included).
void rounded_gemm(Precision p, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  thread_local std::vector<float> a_round, b_round;
  const std::int64_t a_size = matrix_span(trans_a ? k : m, trans_a ? m : k, lda),
                     b_size = matrix_span(trans_b ? n : k, trans_b ? k : n, ldb);
  a_round.resize(std::size_t(a_size));
  b_round.resize(std::size_t(b_size));
  round_to_precision(p, a, a_round.data(), a_size);
  round_to_precision(p, b, b_round.data(), b_size);
  sgemm(trans_a, trans_b, m, n, k, alpha, a_round.data(), lda, b_round.data(), ldb, beta, c, ldc);
}

void run_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc, Precision precision) {
  switch (precision) {
    case Precision::fp32:
      sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Precision::bf16:
      if (dnnl_bf16().native)
        bf16_gemm(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc).run(a, b, c);
      else
        rounded_gemm(Precision::bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Precision::fp16:
      rounded_gemm(Precision::fp16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
  }
}

}  // namespace

namespace {

// The CPU's model name, as lscpu shows it ("AMD EPYC", "Intel(R) Xeon(R) ..."):
// timings are only comparable on the same one.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

class OnednnBackend final : public ComputeBackend {
 public:
  std::string name() const override {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " on " + dnnl_isa_name() + " (" + cpu_model() + "), " +
           std::to_string(dnnl_threads()) + " thread" + (dnnl_threads() == 1 ? "" : "s");
  }
  std::string precision_text(Precision p) const override { return dnnl_precision_text(p); }
  bool device_memory() const override { return false; }

  // oneDNN's sgemm rather than a CBLAS: it dispatches on the CPU it runs on, where
  // Debian's OpenBLAS 0.3.21 falls back to its Haswell kernels on newer CPUs and
  // ran the MLP's shapes at half the speed (tools/gemm_bench prints both when
  // OpenBLAS is installed).
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, Precision precision) override {
    if (m == 0 || n == 0) return;  // an empty batch: nothing to compute
    dnnl_stream();                 // pins this thread's OpenMP team to the rank's thread count
    run_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision);
    kernel_trace::count_library_call();
    if (kernel_trace::recording())
      kernel_trace::record(
          {std::string("gemm ") + precision_name(precision) + " " + std::to_string(m) + "x" +
               std::to_string(n) + "x" + std::to_string(k),
           2.0 * m * n * k,
           [=] { run_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision); }});
  }

  std::unique_ptr<ConvKernels> make_conv(const ConvGeometry& geometry) override {
    return make_onednn_conv(geometry);
  }

  void synchronize() override {}  // every primitive call waits for its stream
};

}  // namespace

std::unique_ptr<ComputeBackend> make_onednn_backend() { return std::make_unique<OnednnBackend>(); }

}  // namespace ddp
