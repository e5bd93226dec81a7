#include "model/gemm.hpp"

#include "comm/check.hpp"
#include "model/backend.hpp"
#include "model/elements.hpp"
#include "model/gelu_math.hpp"
#include "model/select.hpp"

namespace ddp {

namespace {
// gemm_stored's fp32 copies where the backend takes no narrow operands (the host):
// grown only, released at Kokkos's finalize.
struct Widened {
  View1 a, b, c;
};
Widened& widened() {
  static Widened w;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] { w = Widened(); });
    hooked = true;
  }
  return w;
}

float* grown(View1& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) < n)
    v = View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), std::size_t(n));
  return v.data();
}

// The n elements at `from` as floats: themselves where fp32, else widened into v.
const float* widen(const void* from, std::int64_t n, Precision type, View1& v, const char* label) {
  if (type == Precision::fp32) return static_cast<const float*>(from);
  float* w = grown(v, n, label);
  const std::uint16_t* h = static_cast<const std::uint16_t*>(from);
  const bool fp16 = type == Precision::fp16;
  Kokkos::parallel_for(
      label, Range(0, n), KOKKOS_LAMBDA(std::int64_t i) { w[i] = fp16 ? from_fp16(h[i]) : from_bf16(h[i]); });
  return w;
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, Precision precision) {
  compute_backend().gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision);
}

namespace {
void require_stored(Precision precision, GemmStored stored) {
  for (Precision t : {stored.a, stored.b, stored.c})
    DDP_REQUIRE(t == Precision::fp32 || t == precision, "gemm_stored: a "
                                                            << precision_name(t) << " operand of a "
                                                            << precision_name(precision) << " GEMM");
}

// The host's GEMM on narrow operands: they are widened into fp32 scratch (exact: a
// narrow value is a float), the product goes into `into` (fp32, leading dimension
// ldc, with beta) or, where that is null, into fp32 scratch of that leading
// dimension, for the caller to narrow into C. Returns where the product is.
const float* wide_product(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                          int lda, const void* b, int ldb, float beta, float* into, int ldc,
                          Precision precision, GemmStored stored) {
  Widened& w = widened();
  const float* wa =
      widen(a, matrix_span(trans_a ? k : m, trans_a ? m : k, lda), stored.a, w.a, "gemm_stored::widen_a");
  const float* wb =
      widen(b, matrix_span(trans_b ? n : k, trans_b ? k : n, ldb), stored.b, w.b, "gemm_stored::widen_b");
  float* c = into ? into : grown(w.c, matrix_span(m, n, ldc), "gemm_stored::wide_c");
  compute_backend().gemm(trans_a, trans_b, m, n, k, alpha, wa, lda, wb, ldb, into ? beta : 0.0f, c, ldc,
                         precision);
  return c;
}

// The epilogue's pass over C's m x n elements (leading dimension ldc): the product
// read through `p`, C written through `c`, the GELU's input through `pre` (C's type).
// Each kind, with or without a bias, a loop of its own, so the host's loops stay
// plain and vectorise; an fp32 C with p == c gets the bits of the GEMM followed by
// the layers' own passes.
template <GemmEpilogue::Act kAct, bool kTanh, bool kBias, bool kAdd = false, class P, class C>
void epilogue_kind(const char* label, int m, int n, std::int64_t ldc, P p, C c, C pre, const float* bias,
                   const float* add = nullptr) {
  using Act = GemmEpilogue::Act;
  Kokkos::parallel_for(
      label, rows_range(m, n), KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
        const std::int64_t i = r * ldc + j;
        if (kAct == Act::dgelu) {
          c.set(i, p(i) * (kTanh ? gelu_tanh_grad(pre(i)) : gelu_exact_grad(pre(i))));
        } else {
          float v = p(i);
          if (kBias) v += bias[j];
          if (kAct == Act::none) {
            c.set(i, kAdd ? add[i] + v : v);
          } else if (kAct == Act::relu) {
            c.set(i, select_or_zero(relu_passes(v), v));
          } else {
            pre.set(i, v);
            c.set(i, kTanh ? gelu_tanh(v) : gelu_exact(v));
          }
        }
      });
}

template <GemmEpilogue::Act kAct, bool kTanh, class P, class C>
void epilogue_biased(const char* label, int m, int n, std::int64_t ldc, P p, C c, C pre, const float* bias) {
  if (bias)
    epilogue_kind<kAct, kTanh, true>(label, m, n, ldc, p, c, pre, bias);
  else
    epilogue_kind<kAct, kTanh, false>(label, m, n, ldc, p, c, pre, bias);
}

template <class P, class C>
void epilogue_pass(int m, int n, std::int64_t ldc, P p, C c, C pre, const GemmEpilogue& e) {
  using Act = GemmEpilogue::Act;
  if (e.add && e.bias)
    epilogue_kind<Act::none, false, true, true>("gemm_epilogue::bias_add", m, n, ldc, p, c, pre, e.bias,
                                                e.add);
  else if (e.add)
    epilogue_kind<Act::none, false, false, true>("gemm_epilogue::add", m, n, ldc, p, c, pre, e.bias, e.add);
  else if (e.act == Act::none)  // without a bias: only a narrow C's rounding
    epilogue_biased<Act::none, false>(e.bias ? "gemm_epilogue::bias" : "gemm_epilogue::store", m, n, ldc, p,
                                      c, pre, e.bias);
  else if (e.act == Act::relu)
    epilogue_biased<Act::relu, false>("gemm_epilogue::relu", m, n, ldc, p, c, pre, e.bias);
  else if (e.act == Act::gelu && e.tanh)
    epilogue_biased<Act::gelu, true>("gemm_epilogue::gelu_tanh", m, n, ldc, p, c, pre, e.bias);
  else if (e.act == Act::gelu)
    epilogue_biased<Act::gelu, false>("gemm_epilogue::gelu", m, n, ldc, p, c, pre, e.bias);
  else if (e.tanh)
    epilogue_kind<Act::dgelu, true, false>("gemm_epilogue::dgelu_tanh", m, n, ldc, p, c, pre, nullptr);
  else
    epilogue_kind<Act::dgelu, false, false>("gemm_epilogue::dgelu", m, n, ldc, p, c, pre, nullptr);
}
}  // namespace

void gemm_stored(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                 const void* b, int ldb, float beta, void* c, int ldc, Precision precision,
                 GemmStored stored) {
  require_stored(precision, stored);
  DDP_REQUIRE(stored.c == Precision::fp32 || beta == 0.0f,
              "gemm_stored: a narrow C is written, not added to");
  ComputeBackend& backend = compute_backend();
  if (!stored.narrow()) {
    backend.gemm(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda,
                 static_cast<const float*>(b), ldb, beta, static_cast<float*>(c), ldc, precision);
    return;
  }
  if (backend.gemm_takes_stored()) {
    backend.gemm_stored(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, precision, stored);
    return;
  }
  if (m == 0 || n == 0) return;
  if (stored.c == Precision::fp32) {
    wide_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, static_cast<float*>(c), ldc,
                 precision, stored);
    return;
  }
  // Only C's own elements: a row's tail past n (ldc > n) is another matrix's.
  const Fp32Elements<const float> p{
      wide_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.0f, nullptr, ldc, precision, stored)};
  const NarrowElements<std::uint16_t> out{static_cast<std::uint16_t*>(c), stored.c == Precision::fp16};
  epilogue_pass(m, n, ldc, p, out, out, GemmEpilogue{});
}

void gemm_epilogue(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda, const void* b,
                   int ldb, void* c, int ldc, Precision precision, GemmStored stored,
                   const GemmEpilogue& epilogue) {
  using Act = GemmEpilogue::Act;
  require_stored(precision, stored);
  DDP_REQUIRE((epilogue.pre != nullptr) == (epilogue.act == Act::gelu || epilogue.act == Act::dgelu),
              "gemm_epilogue: the GELU's input is where a GELU is, and only there");
  DDP_REQUIRE(epilogue.act != Act::dgelu || !epilogue.bias, "gemm_epilogue: a bias with the GELU's gradient");
  DDP_REQUIRE(!epilogue.add || (epilogue.act == Act::none && stored.c == Precision::fp32),
              "gemm_epilogue: a residual added to an activation or a narrow C");
  if (m == 0 || n == 0) return;
  ComputeBackend& backend = compute_backend();
  if (backend.gemm_epilogue(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, precision, stored, epilogue))
    return;
  if (epilogue.act == Act::none && !epilogue.bias && !epilogue.add) {
    gemm_stored(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, precision, stored);
    return;
  }
  const bool narrow_c = stored.c != Precision::fp32, fp16 = stored.c == Precision::fp16;
  if (!narrow_c) {
    gemm_stored(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, precision, stored);
    const Fp32Elements<float> out{static_cast<float*>(c)};
    epilogue_pass(m, n, ldc, out, out, Fp32Elements<float>{static_cast<float*>(epilogue.pre)}, epilogue);
    return;
  }
  const NarrowElements<std::uint16_t> out{static_cast<std::uint16_t*>(c), fp16},
      pre{static_cast<std::uint16_t*>(epilogue.pre), fp16};
  if (backend.gemm_takes_stored()) {  // C written narrow by the GEMM: read back as it is
    gemm_stored(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, precision, stored);
    epilogue_pass(m, n, ldc, out, out, pre, epilogue);
    return;
  }
  const Fp32Elements<const float> p{
      wide_product(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, nullptr, ldc, precision, stored)};
  epilogue_pass(m, n, ldc, p, out, pre, epilogue);
}

void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch, Precision precision) {
  compute_backend().gemm_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                                 c, ldc, stride_c, batch, precision);
}

void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                         GemmSteps item, int groups, GemmSteps group, Precision precision) {
  compute_backend().gemm_batched_groups(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch,
                                        item, groups, group, precision);
}

}  // namespace ddp
