#include "model/gemm.hpp"

#include "comm/check.hpp"
#include "model/backend.hpp"
#include "model/elements.hpp"

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

void gemm_stored(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                 const void* b, int ldb, float beta, void* c, int ldc, Precision precision,
                 GemmStored stored) {
  for (Precision t : {stored.a, stored.b, stored.c})
    DDP_REQUIRE(t == Precision::fp32 || t == precision, "gemm_stored: a "
                                                            << precision_name(t) << " operand of a "
                                                            << precision_name(precision) << " GEMM");
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
  Widened& w = widened();
  const float* wa =
      widen(a, matrix_span(trans_a ? k : m, trans_a ? m : k, lda), stored.a, w.a, "gemm_stored::widen_a");
  const float* wb =
      widen(b, matrix_span(trans_b ? n : k, trans_b ? k : n, ldb), stored.b, w.b, "gemm_stored::widen_b");
  if (stored.c == Precision::fp32) {
    backend.gemm(trans_a, trans_b, m, n, k, alpha, wa, lda, wb, ldb, beta, static_cast<float*>(c), ldc,
                 precision);
    return;
  }
  const float* wc = grown(w.c, matrix_span(m, n, ldc), "gemm_stored::wide_c");
  backend.gemm(trans_a, trans_b, m, n, k, alpha, wa, lda, wb, ldb, 0.0f, w.c.data(), ldc, precision);
  // Only C's own elements: a row's tail past n (ldc > n) is another matrix's.
  const NarrowElements<std::uint16_t> out{static_cast<std::uint16_t*>(c), stored.c == Precision::fp16};
  const std::int64_t ld = ldc;
  Kokkos::parallel_for(
      "gemm_stored::narrow_c", rows_range(m, n),
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) { out.set(r * ld + j, wc[r * ld + j]); });
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
