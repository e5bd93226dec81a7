#include "model/onednn/dnnl_engine.hpp"

#include <omp.h>

#include <cstdlib>

namespace ddp {

namespace {
struct DnnlContext {
  dnnl::engine engine;
  dnnl::stream stream;
  int threads;

  DnnlContext() {
    const char* ddp_threads = std::getenv("DDP_DNNL_THREADS");
    if (ddp_threads && std::atoi(ddp_threads) > 0)
      threads = std::atoi(ddp_threads);
    else if (!std::getenv("OMP_NUM_THREADS"))
      threads = 1;
    else
      threads = omp_get_max_threads();
    engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    stream = dnnl::stream(engine);
  }
};

DnnlContext& context() {
  static DnnlContext c;
  return c;
}
}  // namespace

dnnl::engine& dnnl_engine() { return context().engine; }

// OpenMP's thread count is a per-thread setting, and the trainer may run layers on
// more than one thread (training, validation): each sets it once, here. Without
// this a rank's oneDNN calls would use every core, and 2 ranks on 2 cores spin-wait
// against each other (3x slower measured).
dnnl::stream& dnnl_stream() {
  DnnlContext& c = context();
  thread_local const bool pinned = (omp_set_num_threads(c.threads), true);
  (void)pinned;
  return c.stream;
}
int dnnl_threads() { return context().threads; }

const DnnlBf16& dnnl_bf16() {
  static const DnnlBf16 answer = [] {
    using dnnl::memory;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
    DnnlBf16 a;
    dnnl_stream();  // one thread per rank, as every primitive is created
    try {
      const memory::desc src({64, 256}, bf16, tag::ab), wei({256, 64}, bf16, tag::ab),
          dst({64, 64}, f32, tag::ab);
      const dnnl::matmul::primitive_desc mm(dnnl::matmul::desc(src, wei, dst), dnnl_engine());
      const memory::desc x({8, 16, 14, 14}, bf16, tag::any), w({16, 16, 3, 3}, bf16, tag::any),
          y({8, 16, 14, 14}, f32, tag::any);
      const dnnl::convolution_forward::primitive_desc conv(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                          dnnl::algorithm::convolution_direct, x, w, y, {1, 1}, {1, 1},
                                          {1, 1}),
          dnnl_engine());
      a.native = true;
      a.impl = mm.impl_info_str();
    } catch (const dnnl::error&) {
      // "could not create a primitive descriptor iterator": no bf16 kernel for this CPU.
      a.native = false;
    }
    return a;
  }();
  return answer;
}

}  // namespace ddp

namespace ddp {

const char* dnnl_isa_name() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  using I = dnnl::cpu_isa;
  switch (isa) {
    case I::sse41:
      return "SSE4.1";
    case I::avx:
      return "AVX";
    case I::avx2:
      return "AVX2";
    case I::avx2_vnni:
      return "AVX2 VNNI";
    case I::avx512_core:
      return "AVX-512";
    case I::avx512_core_vnni:
      return "AVX-512 VNNI";
    case I::avx512_core_bf16:
      return "AVX-512 BF16";
    case I::avx512_core_amx:
      return "AVX-512 AMX";
    default:
      return "other ISA";
  }
}

std::string dnnl_precision_text(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return dnnl_bf16().native
                 ? "bf16 (oneDNN " + dnnl_bf16().impl + ")"
                 : "bf16 (emulated: oneDNN has no bf16 kernels for " + std::string(dnnl_isa_name()) +
                       "; bf16-rounded operands, fp32 products)";
    case Precision::fp16:
      return "fp16 (emulated: fp16-rounded operands, fp32 products)";
  }
  return "?";
}

}  // namespace ddp
