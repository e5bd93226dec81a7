// train.precision on the host: rounding to bf16/fp16, the GEMM and the convolution
// with bf16/fp16 operands against fp32 computations on operands rounded beforehand
// (which is what "bf16 operands, fp32 accumulation" means), and fp16 overflow.

#include "model/precision.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "comm/check.hpp"
#include "forwarding_backend.hpp"
#include "layer_fixture.hpp"
#include "model/backend.hpp"
#include "model/gemm.hpp"
#include "model/kernel_trace.hpp"
#include "model/linear.hpp"

namespace ddp {
namespace {

using test::BoundLayer;
using test::from_host;
using test::make_tensor;
using test::max_relative_error;
using test::random_values;
using test::to_host;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

std::vector<float> rounded(Precision p, std::vector<float> v) {
  round_to_precision(p, v.data(), v.data(), std::int64_t(v.size()));
  return v;
}

TEST(Precision, RoundingBf16) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);                // a tie: to even
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);  // a tie: to even (up)
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(round_bf16(70000.0f), 70144.0f);  // bf16 has fp32's range
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(round_bf16(std::nanf(""))));
}

TEST(Precision, RoundingFp16) {
  EXPECT_EQ(round_fp16(1.0f + 0x1p-11f), 1.0f);                // a tie: to even
  EXPECT_EQ(round_fp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);  // a tie: to even (up)
  EXPECT_EQ(round_fp16(65504.0f), 65504.0f);                   // the largest fp16
  EXPECT_EQ(round_fp16(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_fp16(65520.0f)));  // the tie above it goes to inf
  EXPECT_TRUE(std::isinf(round_fp16(-1e6f)) && round_fp16(-1e6f) < 0);
  EXPECT_EQ(round_fp16(0x1p-24f), 0x1p-24f);      // the smallest subnormal
  EXPECT_EQ(round_fp16(0x1p-25f), 0.0f);          // a tie: to even (zero)
  EXPECT_EQ(round_fp16(3 * 0x1p-25f), 0x1p-23f);  // a tie: to even (up)
  EXPECT_EQ(round_fp16(0x1p-14f + 0x1p-25f), 0x1p-14f);
}

// The vectorised rounding (F16C on x86) equals the scalar one bit for bit, from
// subnormals to overflow.
TEST(Precision, VectorRoundingEqualsScalar) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 18), sign(0, 1);
  std::vector<float> v(100003);
  for (float& x : v) x = (sign(gen) ? -1.0f : 1.0f) * std::ldexp(mantissa(gen), exponent(gen));
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const std::vector<float> r = rounded(p, v);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < v.size(); ++i)
      differ += bits(r[i]) != bits(p == Precision::bf16 ? round_bf16(v[i]) : round_fp16(v[i]));
    EXPECT_EQ(differ, 0u) << precision_name(p);
  }
}

TEST(Precision, Names) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_THROW(parse_precision("fp8"), InputError);
}

// The GPU build's start-up check (ComputeBackend::precision_unsupported): bf16 tensor
// cores from compute capability 8.0 (Ampere), fp16 from 7.0 (Volta); fp32 anywhere.
TEST(Precision, TensorCoresByComputeCapability) {
  for (int major : {5, 6, 7, 8, 9, 10}) {
    EXPECT_EQ(missing_tensor_cores(Precision::fp32, major, 0), "");
    EXPECT_EQ(missing_tensor_cores(Precision::bf16, major, 0).empty(), major >= 8) << major;
    EXPECT_EQ(missing_tensor_cores(Precision::fp16, major, 0).empty(), major >= 7) << major;
  }
  EXPECT_EQ(missing_tensor_cores(Precision::bf16, 7, 5),
            "compute capability 7.5 has no bf16 tensor cores (they need 8.0, Ampere, or newer)");
  EXPECT_EQ(missing_tensor_cores(Precision::fp16, 6, 1),
            "compute capability 6.1 has no fp16 tensor cores (they need 7.0, Volta, or newer)");
  // Where the tensors stay on the host, every precision runs (bf16 emulated where the
  // CPU has no bf16 kernels).
  if (!compute_backend().device_memory()) {
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
      EXPECT_EQ(compute_backend().precision_unsupported(p), "");
  }
}

// C = alpha op(A) op(B) + beta C with rounded operands, in double.
std::vector<float> reference_gemm(bool ta, bool tb, int m, int n, int k, float alpha,
                                  const std::vector<float>& a, const std::vector<float>& b, float beta,
                                  std::vector<float> c) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l)
        s += double(ta ? a[l * m + i] : a[i * k + l]) * double(tb ? b[j * k + l] : b[l * n + j]);
      c[i * n + j] = float(alpha * s + beta * double(c[i * n + j]));
    }
  return c;
}

// ddp::gemm on copies in the tensors' memory space (device memory in the GPU build).
std::vector<float> device_gemm(bool ta, bool tb, int m, int n, int k, float alpha,
                               const std::vector<float>& a, int lda, const std::vector<float>& b, int ldb,
                               float beta, const std::vector<float>& c, int ldc, Precision p) {
  View1 av("test::a", a.size()), bv("test::b", b.size()), cv("test::c", c.size());
  from_host(av, a);
  from_host(bv, b);
  from_host(cv, c);
  gemm(ta, tb, m, n, k, alpha, av.data(), lda, bv.data(), ldb, beta, cv.data(), ldc, p);
  return to_host(cv, std::int64_t(c.size()));
}

TEST(Precision, GemmOperandsAreRounded) {
  const int m = 37, n = 29, k = 71;
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const std::vector<float> a = random_values(m * k, 1 + t), b = random_values(k * n, 11 + t),
                               c0 = random_values(m * n, 21 + t);
      const std::vector<float> c =
          device_gemm(ta, tb, m, n, k, 0.5f, a, ta ? m : k, b, tb ? k : n, 1.0f, c0, n, p);
      const std::vector<float> want =
          reference_gemm(ta, tb, m, n, k, 0.5f, rounded(p, a), rounded(p, b), 1.0f, c0);
      const std::vector<float> fp32 = reference_gemm(ta, tb, m, n, k, 0.5f, a, b, 1.0f, c0);
      const double err = max_relative_error(c, want), rounding = max_relative_error(want, fp32);
      EXPECT_LT(err, 1e-6) << precision_name(p) << " trans " << ta << tb;
      // The operands' rounding shows: the result is far closer to the rounded
      // reference than to fp32.
      EXPECT_GT(rounding, 100 * err) << precision_name(p) << " trans " << ta << tb;
    }
}

// gemm_batched as attention calls it: 3 heads side by side in each row of A and B
// (stride one head's columns, ld the whole row), and C's blocks either apart or,
// as attention's O, dV, dQ and dK, side by side in its rows (stride n, ld past 3 n),
// every transpose, at each precision, beta 0 and 0.75 (attention's block path adds
// dK and dV of later blocks into side-by-side blocks: beta 1): each C_i as the
// reference's on its operands (rounded to the precision); C outside the blocks
// untouched. The GPU build's one strided-batched cuBLAS call; the host's loop.
TEST(Precision, BatchedGemmIsEachProduct) {
  const int m = 9, n = 7, k = 5, batch = 3;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (int t = 0; t < 16; ++t) {
      const bool ta = t & 1, tb = t & 2, interleaved = t & 4;
      const float beta = t & 8 ? 0.75f : 0.0f;
      // A_i (m, k) or (k, m) stored as head i's columns of a wider row-major matrix
      const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      const int lda = batch * a_cols + 2, ldb = batch * b_cols + 1, ldc = interleaved ? batch * n + 2 : n + 3;
      const std::int64_t c_stride = interleaved ? n : std::int64_t(m) * ldc,
                         c_size = interleaved ? std::int64_t(m) * ldc : c_stride * batch;
      const std::vector<float> a = random_values(std::size_t(a_rows) * lda, 31 + t),
                               b = random_values(std::size_t(b_rows) * ldb, 41 + t),
                               c0 = random_values(std::size_t(c_size), 51 + t);
      View1 av("test::a", a.size()), bv("test::b", b.size()), cv("test::c", c0.size());
      from_host(av, a);
      from_host(bv, b);
      from_host(cv, c0);
      gemm_batched(ta, tb, m, n, k, 0.5f, av.data(), lda, a_cols, bv.data(), ldb, b_cols, beta, cv.data(),
                   ldc, c_stride, batch, p);
      const std::vector<float> c = to_host(cv, c_size);
      std::vector<bool> in_block(c.size(), false);
      for (int i = 0; i < batch; ++i) {
        std::vector<float> ai(std::size_t(a_rows) * a_cols), bi(std::size_t(b_rows) * b_cols),
            ci(std::size_t(m) * n), got(std::size_t(m) * n);
        for (int r = 0; r < a_rows; ++r)
          for (int q = 0; q < a_cols; ++q) ai[r * a_cols + q] = a[r * lda + i * a_cols + q];
        for (int r = 0; r < b_rows; ++r)
          for (int q = 0; q < b_cols; ++q) bi[r * b_cols + q] = b[r * ldb + i * b_cols + q];
        for (int r = 0; r < m; ++r)
          for (int q = 0; q < n; ++q) {
            const std::int64_t e = i * c_stride + r * ldc + q;
            ci[r * n + q] = c0[e];
            got[r * n + q] = c[e];
            in_block[e] = true;
          }
        const std::vector<float> want =
            reference_gemm(ta, tb, m, n, k, 0.5f, rounded(p, ai), rounded(p, bi), beta, ci);
        EXPECT_LT(max_relative_error(got, want), 1e-6) << precision_name(p) << " trans " << ta << tb
                                                       << (interleaved ? " interleaved" : "") << " C_" << i;
      }
      for (std::size_t e = 0; e < c.size(); ++e) {
        if (!in_block[e]) {
          EXPECT_EQ(c[e], c0[e]) << "C's element " << e << " outside the blocks";
        }
      }
    }
}

// gemm_batched_groups as attention's keep path calls it: items (heads) side by side
// in each row, groups (samples) rows apart with a gap row between, C's blocks side by
// side in its rows (O, dV, dQ, dK) or apart (the scores), at each precision, every
// transpose, beta 0 and 0.75, with fewer groups than items and more (the GPU build's
// strided-batched calls go by group in one case, by item in the other, on operands
// narrowed once over the whole span): each C_gi as the reference's, C outside the
// blocks untouched.
TEST(Precision, GroupedBatchedGemmIsEachProduct) {
  const int m = 6, n = 5, k = 4;
  for (const auto& [batch, groups] : {std::pair{3, 2}, std::pair{2, 5}})
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
      for (int t = 0; t < 16; ++t) {
        const bool ta = t & 1, tb = t & 2, side_by_side = t & 4;
        const float beta = t & 8 ? 0.75f : 0.0f;
        const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const int lda = batch * a_cols + 2, ldb = batch * b_cols + 1,
                  ldc = side_by_side ? batch * n + 2 : n + 3;
        const GemmSteps item{a_cols, b_cols, side_by_side ? n : std::int64_t(m) * ldc};
        const GemmSteps group{std::int64_t(a_rows + 1) * lda, std::int64_t(b_rows + 1) * ldb,
                              side_by_side ? std::int64_t(m + 1) * ldc : item.c * batch + 7};
        const std::int64_t c_size = group.c * groups;
        const std::vector<float> a = random_values(std::size_t(group.a * groups), 61 + t),
                                 b = random_values(std::size_t(group.b * groups), 71 + t),
                                 c0 = random_values(std::size_t(c_size), 81 + t);
        View1 av("test::a", a.size()), bv("test::b", b.size()), cv("test::c", c0.size());
        from_host(av, a);
        from_host(bv, b);
        from_host(cv, c0);
        gemm_batched_groups(ta, tb, m, n, k, 0.5f, av.data(), lda, bv.data(), ldb, beta, cv.data(), ldc,
                            batch, item, groups, group, p);
        const std::vector<float> c = to_host(cv, c_size);
        std::vector<bool> in_block(c.size(), false);
        for (int g = 0; g < groups; ++g)
          for (int i = 0; i < batch; ++i) {
            std::vector<float> ai(std::size_t(a_rows) * a_cols), bi(std::size_t(b_rows) * b_cols),
                ci(std::size_t(m) * n), got(std::size_t(m) * n);
            for (int r = 0; r < a_rows; ++r)
              for (int q = 0; q < a_cols; ++q) ai[r * a_cols + q] = a[g * group.a + r * lda + i * item.a + q];
            for (int r = 0; r < b_rows; ++r)
              for (int q = 0; q < b_cols; ++q) bi[r * b_cols + q] = b[g * group.b + r * ldb + i * item.b + q];
            for (int r = 0; r < m; ++r)
              for (int q = 0; q < n; ++q) {
                const std::int64_t e = g * group.c + i * item.c + r * ldc + q;
                ci[r * n + q] = c0[e];
                got[r * n + q] = c[e];
                in_block[e] = true;
              }
            const std::vector<float> want =
                reference_gemm(ta, tb, m, n, k, 0.5f, rounded(p, ai), rounded(p, bi), beta, ci);
            EXPECT_LT(max_relative_error(got, want), 1e-6)
                << precision_name(p) << " " << groups << " groups of " << batch << ", trans " << ta << tb
                << (side_by_side ? " side by side" : "") << " C_" << g << "," << i;
          }
        for (std::size_t e = 0; e < c.size(); ++e) {
          if (!in_block[e]) {
            EXPECT_EQ(c[e], c0[e]) << "C's element " << e << " outside the blocks";
          }
        }
      }
}

TEST(Precision, Fp16OverflowsLikeFp16AndBf16DoesNot) {
  const std::vector<float> a = {70000.0f, 1.0f}, b = {1.0f, 1.0f};
  float c = device_gemm(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, {0.0f}, 1, Precision::fp16)[0];
  EXPECT_TRUE(std::isinf(c)) << c;
  c = device_gemm(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, {0.0f}, 1, Precision::bf16)[0];
  EXPECT_EQ(c, 70145.0f);
}

// A layer at precision p against the same layer in fp32 on rounded operands:
// forward (x, w), backward weights (x, dy) and backward data (dy, w).
void check_layer(const std::string& spec, const Shape& in, std::int64_t B, Precision p) {
  BoundLayer low(spec, in), ref(spec, in);
  low.layer->set_precision(p);
  const std::vector<float> params = to_host(low.params, low.n);
  const Shape x_shape = low.batch_shape(B, in), y_shape = low.batch_shape(B, low.out_sample);
  const std::vector<float> x = random_values(shape_numel(x_shape), 3),
                           dy = random_values(shape_numel(y_shape), 4);

  Tensor xl = make_tensor(x_shape, x), yl, dyl = make_tensor(y_shape, dy), dxl;
  low.layer->forward(xl, yl, true);
  low.layer->backward(xl, yl, dyl, dxl);

  // Reference: weights rounded for forward and backward data; the bias stays fp32.
  std::vector<float> w_rounded = params;
  const std::int64_t nw = shape_numel(low.layer->parameter_specs()[0].shape);
  round_to_precision(p, w_rounded.data(), w_rounded.data(), nw);
  from_host(ref.params, w_rounded);
  Tensor xr = make_tensor(x_shape, rounded(p, x)), yr, dyr = make_tensor(y_shape, rounded(p, dy)), dxr;
  ref.layer->forward(xr, yr, true);
  ref.layer->backward(xr, yr, dyr, dxr);
  const std::int64_t ny = shape_numel(y_shape), nx = shape_numel(x_shape);
  // The results are fp32 (oneDNN's fp32 destinations, or rounded operands in fp32 on
  // either backend), but for cuDNN's own bf16/fp16 convolutions (GPU build with
  // unless DDP_CUDNN_NARROW=0), which store y, dx and dw in the narrow type: those are its
  // rounding (2^-8 for bf16, 2^-11 for fp16) off the fp32 result.
  const bool narrow_results = spec.rfind("conv2d", 0) == 0 && compute_backend().narrow_convolution_results(p);
  const double tol = narrow_results ? (p == Precision::bf16 ? 8e-3 : 1e-3) : 2e-6;
  EXPECT_LT(max_relative_error(to_host(yl.data, ny), to_host(yr.data, ny)), tol)
      << spec << " " << precision_name(p);
  // The weight gradient (the bias gradient is a plain sum of dy, which linear takes
  // in fp32 and the bf16 convolution from its bf16 copy of dy).
  EXPECT_LT(max_relative_error(to_host(low.grads, nw), to_host(ref.grads, nw)), tol)
      << spec << " " << precision_name(p);
  EXPECT_LT(max_relative_error(to_host(dxl.data, nx), to_host(dxr.data, nx)), tol)
      << spec << " " << precision_name(p);

  // And the rounding is really there: fp32 operands give a visibly different y.
  BoundLayer exact(spec, in);
  Tensor xe = make_tensor(x_shape, x), ye;
  exact.layer->forward(xe, ye, true);
  EXPECT_GT(max_relative_error(to_host(ye.data, ny), to_host(yr.data, ny)), 1e-5)
      << spec << " " << precision_name(p);
}

TEST(Precision, LinearBf16) { check_layer("linear(24)", {40}, 9, Precision::bf16); }
TEST(Precision, LinearFp16) { check_layer("linear(24)", {40}, 9, Precision::fp16); }
TEST(Precision, Conv2dBf16) { check_layer("conv2d(16, 3, pad=1)", {8, 9, 9}, 4, Precision::bf16); }
TEST(Precision, Conv2dFp16) { check_layer("conv2d(16, 3, pad=1)", {8, 9, 9}, 4, Precision::fp16); }
TEST(Precision, Conv2dOneInputChannelBf16) {
  check_layer("conv2d(32, 3, pad=1)", {1, 12, 12}, 3, Precision::bf16);
}

// attention at bf16/fp16: every GEMM's operands rounded (the per-head ones read the
// heads' columns in place, whose rounded copies take a row more: attention.cpp's
// with_slack), the softmax in fp32; near fp32 by the operands' rounding, and visibly
// not fp32.
TEST(Precision, AttentionNearFp32) {
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    BoundLayer low("attention(4, causal)", {12, 32}), exact("attention(4, causal)", {12, 32});
    from_host(exact.params, to_host(low.params, low.n));
    low.layer->set_precision(p);
    const std::vector<float> x = random_values(3 * 12 * 32, 5), dy = random_values(3 * 12 * 32, 6);
    std::vector<std::vector<float>> got[2];
    for (int i = 0; i < 2; ++i) {
      BoundLayer& b = i == 0 ? low : exact;
      Tensor xt = make_tensor({3, 12, 32}, x), yt, dyt = make_tensor({3, 12, 32}, dy), dxt;
      b.layer->forward(xt, yt, true);
      b.layer->backward(xt, yt, dyt, dxt);
      got[i] = {to_host(yt.data, yt.numel()), to_host(dxt.data, dxt.numel()), to_host(b.grads, b.n)};
    }
    // bf16 keeps 8 bits of mantissa, fp16 11: a few roundings deep
    const double tol = p == Precision::bf16 ? 1.5e-2 : 2e-3;
    const char* what[] = {"y", "dx", "parameter gradients"};
    for (int k = 0; k < 3; ++k) {
      const double err = test::norm_relative_error(got[0][k], got[1][k]);
      EXPECT_LT(err, tol) << what[k] << " " << precision_name(p);
      EXPECT_GT(err, 1e-5) << what[k] << " " << precision_name(p);
      std::cout << "  attention " << precision_name(p) << " " << what[k] << ": norm rel err " << err << "\n";
    }
  }
}

// A backend that hands every call to the process's own, and keeps the narrow copies
// layers ask for (NarrowedOnce) its own way. copies = true (the host): as the values
// rounded to the precision in fp32, which the host's GEMMs round again to the same
// bits, found for an operand's whole span as the GPU's backend finds them, and
// counted each time they serve one. copies = false (the GPU): none, so every product
// narrows its operands, as before the GPU's backend kept copies.
class CopyingBackend final : public test::ForwardingBackend {
 public:
  CopyingBackend(ComputeBackend& inner, bool copies) : ForwardingBackend(inner), copies_on_(copies) {}
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, Precision p) override {
    inner_.gemm(trans_a, trans_b, m, n, k, alpha,
                kept(a, matrix_span(trans_a ? k : m, trans_a ? m : k, lda), p), lda,
                kept(b, matrix_span(trans_b ? n : k, trans_b ? k : n, ldb), p), ldb, beta, c, ldc, p);
  }
  void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                    float* c, int ldc, std::int64_t stride_c, int batch, Precision p) override {
    inner_.gemm_batched(trans_a, trans_b, m, n, k, alpha,
                        kept(a, batch_span(trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a), p), lda,
                        stride_a,
                        kept(b, batch_span(trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b), p), ldb,
                        stride_b, beta, c, ldc, stride_c, batch, p);
  }
  void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                           int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                           GemmSteps item, int groups, GemmSteps group, Precision p) override {
    const std::int64_t a_span =
                           batch_span(trans_a ? k : m, trans_a ? m : k, lda, batch, item.a, groups, group.a),
                       b_span =
                           batch_span(trans_b ? n : k, trans_b ? k : n, ldb, batch, item.b, groups, group.b);
    inner_.gemm_batched_groups(trans_a, trans_b, m, n, k, alpha, kept(a, a_span, p), lda, kept(b, b_span, p),
                               ldb, beta, c, ldc, batch, item, groups, group, p);
  }
  std::int64_t narrow_copy_floats(std::int64_t n, Precision p) const override {
    return copies_on_ ? (p == Precision::fp32 ? 0 : n) : 0;
  }
  void narrow_copy(const float* from, std::int64_t n, Precision p, float* to) override {
    round_to_precision(p, from, to, n);
    copies_.add(from, n, p, to, sizeof(float));
    live_.push_back({from, to, n, 0});
  }
  void forget_narrow_copy(const float* from) override {
    copies_.forget(from);
    for (std::size_t i = 0; i < live_.size(); ++i)
      if (live_[i].from == from) {
        reads.push_back(live_[i].reads);
        live_.erase(live_.begin() + std::ptrdiff_t(i));
        return;
      }
  }
  std::vector<int> reads;  // each copy forgotten: the operands it served
  std::size_t live() const { return live_.size(); }

 private:
  // The operand's floats, from a kept copy where one holds its whole span.
  const float* kept(const float* at, std::int64_t span, Precision p) {
    if (p == Precision::fp32) return at;
    const void* copy = copies_.find(at, span, p);
    if (!copy) return at;
    const float* c = static_cast<const float*>(copy);
    for (Live& l : live_)
      if (c >= l.copy && c < l.copy + l.n) ++l.reads;  // the copy holding it
    return c;
  }
  struct Live {
    const float* from;
    const float* copy;
    std::int64_t n;
    int reads;
  };
  bool copies_on_;
  NarrowCopies copies_;
  std::vector<Live> live_;
};

// y, dx and the parameter gradients of forward and backward, and the GPU build's own
// kernels launched (the conversions among them); through a CopyingBackend around
// the process's backend where `copies` is set (its copies' reads into *reads, and
// the copies left unforgotten into *live). fuse_relu: a linear's fused relu.
struct Pass {
  std::vector<std::vector<float>> values;
  std::int64_t own_kernels = 0;
};
Pass forward_backward(const std::string& spec, Precision p, bool fuse_relu, const bool* copies,
                      std::vector<int>* reads = nullptr, std::size_t* live = nullptr) {
  std::unique_ptr<ComputeBackend> own;
  CopyingBackend* wrapper = nullptr;
  if (copies) {
    auto w = std::make_unique<CopyingBackend>(compute_backend(), *copies);
    wrapper = w.get();
    own = swap_compute_backend(std::move(w));
  }
  const std::int64_t B = 3;
  const Shape sample = {12, 32};
  Pass pass;
  {
    BoundLayer l(spec, sample);
    l.layer->set_precision(p);
    if (fuse_relu) dynamic_cast<Linear&>(*l.layer).fuse_relu();
    from_host(l.params, random_values(l.n, 9, -0.3f, 0.3f));  // biases too: none is 0
    const Shape shape = l.batch_shape(B, sample);
    Tensor x = make_tensor(shape, random_values(shape_numel(shape), 7)), y,
           dy = make_tensor(shape, random_values(shape_numel(shape), 8)), dx;
    kernel_trace::start_counting();
    l.layer->forward(x, y, true);
    l.layer->backward(x, y, dy, dx);
    pass.own_kernels = kernel_trace::stop_counting().cuda;
    pass.values = {to_host(y.data, y.numel()), to_host(dx.data, dx.numel()), to_host(l.grads, l.n)};
  }
  if (wrapper) {
    if (reads) *reads = wrapper->reads;
    if (live) *live = wrapper->live();
    swap_compute_backend(std::move(own));
  }
  return pass;
}

// Operands narrowed once a call (NarrowedOnce: attention's qkv, dO and dS, a layer's
// output gradient) give the bits of narrowing them at each product, on both of
// attention's host paths, through a transformer block's Linear layers and a linear
// with its relu fused (whose dy is copied once masked). On the host the copies are
// the test backend's (the host's keeps none): each must serve two products or more,
// or it was not worth making, and none may outlive its call. On a GPU, the backend's
// own copies against the test backend keeping none, with fewer conversions.
TEST(Precision, OperandsNarrowedOnceGiveEachProductsBits) {
  const bool device = compute_backend().device_memory();
  const bool on = true, off = false;
  const char* what[] = {"y", "dx", "parameter gradients"};
  struct Case {
    const char* spec;
    bool fuse_relu;
    std::size_t
        copies;  // made in a forward and backward: qkv; dy, qkv, dO, dS (a block each), dqkv; Linear's dy
  };
  for (const Case& c :
       {Case{"attention(4, causal, block=0)", false, 6}, Case{"attention(4, block=5)", false, 14},
        Case{"transformer_block(4, causal)", false, 8}, Case{"linear(32)", true, 1}})
    for (Precision p : {Precision::bf16, Precision::fp16}) {
      std::vector<int> reads;
      std::size_t live = 0;
      const Pass with_copies = device ? forward_backward(c.spec, p, c.fuse_relu, nullptr)
                                      : forward_backward(c.spec, p, c.fuse_relu, &on, &reads, &live),
                 without = device ? forward_backward(c.spec, p, c.fuse_relu, &off)
                                  : forward_backward(c.spec, p, c.fuse_relu, nullptr);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(with_copies.values[k].size(), without.values[k].size());
        for (std::size_t i = 0; i < with_copies.values[k].size(); ++i)
          ASSERT_EQ(bits(with_copies.values[k][i]), bits(without.values[k][i]))
              << c.spec << " " << precision_name(p) << " " << what[k] << "[" << i << "]";
      }
      if (device) {
        EXPECT_LT(with_copies.own_kernels, without.own_kernels) << c.spec << ": no conversion saved";
        std::cout << "  " << c.spec << " " << precision_name(p) << ": " << with_copies.own_kernels
                  << " own kernels against " << without.own_kernels << "\n";
        continue;
      }
      EXPECT_EQ(live, 0u) << c.spec << ": a copy outlived its call";
      EXPECT_EQ(reads.size(), c.copies) << c.spec;
      for (int r : reads)
        EXPECT_GE(r, 2) << c.spec << " " << precision_name(p) << ": a copy served one product";
    }
}
}  // namespace
}  // namespace ddp
