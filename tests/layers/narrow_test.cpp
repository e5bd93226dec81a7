// Activations kept in the narrow type (model/elements.hpp): the casts against the
// precision's own rounding, and the layers that read and write narrow tensors
// (batch norm, the convolution, the residual block) against the same layers on fp32
// tensors holding the same values. A narrow result must be the fp32 one rounded,
// bit for bit, where the arithmetic is the same; the block, whose convolutions write
// fp32 on the host, within the rounding of its stored activations.
// In the GPU build this test runs its convolutions as the host does, on rounded
// operands in cuDNN's fp32 kernels (DDP_CUDNN_NARROW=0, set before any layer is
// made): the model's own plan of narrow activations is what it checks, against the
// same model kept fp32, which cuDNN's bf16 kernels would narrow too. Those kernels
// are checked by gpu_selftest, layers_precision_test and gpu_step_compare.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <tuple>
#include <utility>

#include "block_chain.hpp"
#include "layer_fixture.hpp"
#include "model/batchnorm.hpp"
#include "model/conv2d.hpp"
#include "model/elements.hpp"
#include "model/gemm.hpp"
#include "model/kernel_trace.hpp"
#include "model/model.hpp"
#include "model/planes.hpp"
#include "model/pool.hpp"
#include "model/resblock.hpp"

namespace ddp {
namespace {

// Before main, so before the GPU backend reads it (once, at its first convolution).
[[maybe_unused]] const bool kRoundedConvolutions = setenv("DDP_CUDNN_NARROW", "0", 1) == 0;

using test::BoundLayer;
using test::ChainResults;
using test::from_host;
using test::norm_relative_error;
using test::random_values;
using test::run_blocks;
using test::to_host;
using test::values;

// Each value through to_bf16/from_bf16 and to_fp16/from_fp16 in a kernel (on the
// device in the GPU build): (bf16, fp16) rounded values.
std::pair<std::vector<float>, std::vector<float>> narrowed_in_a_kernel(const std::vector<float>& x) {
  const std::int64_t n = std::int64_t(x.size());
  View1 in("test::in", n), bf("test::bf16", n), hf("test::fp16", n);
  from_host(in, x);
  Kokkos::parallel_for(
      "test::narrow", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        bf(i) = from_bf16(to_bf16(in(i)));
        hf(i) = from_fp16(to_fp16(in(i)));
      });
  return {to_host(bf, n), to_host(hf, n)};
}

TEST(NarrowElements, CastsRoundAsThePrecisionDoes) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          -70000.0f,
                          1e-8f,
                          -3e-8f,
                          5.9604644775390625e-08f,
                          2.98023223876953125e-08f,
                          2.98023224e-08f,
                          6.1035156e-05f,
                          6.09e-05f,
                          1e-40f,
                          3.0e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          1.00390625f,
                          1.01171875f,
                          1.0009765625f};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 18);
  for (int i = 0; i < 20000; ++i)
    x.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mantissa(gen), exponent(gen)));
  for (int i = 0; i < 4000; ++i)  // exact ties: fp16's, then bf16's
    for (std::uint32_t u :
         {(std::uint32_t(gen()) & 0xffffe000u) | 0x1000u, (std::uint32_t(gen()) & 0xffff0000u) | 0x8000u}) {
      float f;
      std::memcpy(&f, &u, 4);
      if (std::isfinite(f)) x.push_back(f);
    }
  const auto [bf, hf] = narrowed_in_a_kernel(x);
  std::size_t off_bf = 0, off_hf = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    off_bf += float_bits(bf[i]) != float_bits(round_bf16(x[i]));
    off_hf += float_bits(hf[i]) != float_bits(round_fp16(x[i]));
  }
  EXPECT_EQ(off_bf, 0u) << "of " << x.size();
  EXPECT_EQ(off_hf, 0u) << "of " << x.size();
  // The encodings themselves
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(to_fp16(5.9604644775390625e-08f), 0x0001);
  EXPECT_EQ(to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(from_fp16(to_fp16(std::nanf("")))));
}

// Every 16-bit pattern h through from_fp16 and from_bf16 in a kernel (on the device
// in the GPU build), as float bits, and narrowed back with to_fp16 and to_bf16:
// {fp16 widened, bf16 widened, fp16 back, bf16 back}, indexed by h. A function of its
// own: CUDA's extended lambdas cannot be in a test's body.
std::array<std::vector<std::uint32_t>, 4> every_pattern_in_a_kernel() {
  constexpr std::int64_t n = 65536;
  Kokkos::View<std::uint32_t* [4]> out("test::patterns", n);
  Kokkos::parallel_for(
      "test::widen", Range(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const auto h = static_cast<std::uint16_t>(i);
        out(i, 0) = float_bits(from_fp16(h));
        out(i, 1) = float_bits(from_bf16(h));
        out(i, 2) = to_fp16(from_fp16(h));
        out(i, 3) = to_bf16(from_bf16(h));
      });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  std::array<std::vector<std::uint32_t>, 4> r;
  for (int k = 0; k < 4; ++k)
    for (std::int64_t i = 0; i < n; ++i) r[std::size_t(k)].push_back(host(i, k));
  return r;
}

// Every 16-bit pattern widened in a kernel, bit for bit: fp16 as its value (zero and
// subnormals m 2^-24, normals (1024 + m) 2^(e-25), inf, NaN with its sign and
// payload), bf16 as the float's upper half; and narrowed back to itself (a NaN to a
// quiet NaN of its sign).
TEST(NarrowElements, EveryPatternWidensExactlyAndBack) {
  const auto [hf, bf, hf2, bf2] = every_pattern_in_a_kernel();
  std::size_t off_hf = 0, off_bf = 0, off_back_hf = 0, off_back_bf = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    std::uint32_t want;
    if (e == 31) {
      want = sign | 0x7f800000u | (m << 13);
    } else {
      const float v = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), int(e) - 25);
      want = sign | float_bits(v);
    }
    off_hf += hf[h] != want;
    off_bf += bf[h] != h << 16;
    const bool nan_hf = e == 31 && m != 0, nan_bf = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    off_back_hf += hf2[h] != (nan_hf ? ((h & 0x8000u) | 0x7e00u) : h);
    off_back_bf += bf2[h] != (nan_bf ? (h | 0x40u) : h);
  }
  EXPECT_EQ(off_hf, 0u) << "fp16 patterns widened wrong";
  EXPECT_EQ(off_bf, 0u) << "bf16 patterns widened wrong";
  EXPECT_EQ(off_back_hf, 0u) << "fp16 patterns not back to themselves";
  EXPECT_EQ(off_back_bf, 0u) << "bf16 patterns not back to themselves";
}

// A (B, sample) tensor of `type` in `layout` holding `values` rounded to it, and its
// fp32 twin holding the same (widened) values.
std::pair<Tensor, Tensor> narrow_and_wide(std::int64_t B, const Shape& sample, Layout layout, Precision type,
                                          std::uint32_t seed) {
  Tensor given, narrow, wide;
  resize(given, B, sample, "test::given", layout);
  from_host(given.data, random_values(given.storage_numel(), seed));
  convert_type(given, narrow, type, "test::narrow");
  convert_type(narrow, wide, Precision::fp32, "test::wide");
  return {narrow, wide};
}

// gemm_stored (model/gemm.hpp) at precision p: C (m, n) = A (m, k) B^T with A narrow, B
// fp32 or narrow, C narrow inside a wider matrix (ldc = n + 3, its tail columns
// holding 7) or fp32, against gemm on the widened values with C's fp32 result rounded
// to p after. Where the backend widens and narrows around its own gemm (the host), bit
// for bit; where it reads and writes them itself (cuBLAS: another kernel for a narrow
// C, whose sums may go in another order), each element within one rounding of p of
// the reference's and fp32 results within 1e-6 and k fp32 roundings of terms under 1.
// The tail columns stay 7 either way.
TEST(GemmStored, NarrowOperandsAndResultsAsTheirWidenedValues) {
  const std::int64_t m = 37, n = 19, k = 45, ldc = n + 3;
  const bool exact = !compute_backend().gemm_takes_stored();
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (bool narrow_b : {false, true})
      for (bool narrow_c : {false, true}) {
        SCOPED_TRACE(std::string(precision_name(p)) + (narrow_b ? ", B narrow" : ", B fp32") +
                     (narrow_c ? ", C narrow" : ", C fp32"));
        const auto [a, a_wide] = narrow_and_wide(m, {k}, Layout::nchw, p, 71);
        const auto [b, b_wide] = narrow_and_wide(n, {k}, Layout::nchw, p, 72);
        // The reference C with the same leading dimension (cuBLAS may choose its kernel
        // by C's alignment).
        Tensor ref, c_given, c;
        resize(ref, m, {ldc}, "test::reference");
        gemm(false, true, int(m), int(n), int(k), 1.0f, a_wide.data.data(), int(k), b_wide.data.data(),
             int(k), 0.0f, ref.data.data(), int(ldc), p);
        resize(c_given, m, {ldc}, "test::c_given");
        Kokkos::deep_copy(c_given.data, 7.0f);
        convert_type(c_given, c, narrow_c ? p : Precision::fp32, "test::c");
        gemm_stored(false, true, int(m), int(n), int(k), 1.0f, a.data.data(), int(k),
                    (narrow_b ? b : b_wide).data.data(), int(k), 0.0f, c.data.data(), int(ldc), p,
                    {p, narrow_b ? p : Precision::fp32, narrow_c ? p : Precision::fp32});
        Tensor got, rounded_narrow, rounded;
        convert_type(c, got, Precision::fp32, "test::got");
        convert_type(ref, rounded_narrow, narrow_c ? p : Precision::fp32, "test::rounded_narrow");
        convert_type(rounded_narrow, rounded, Precision::fp32, "test::rounded");
        const std::vector<float> g = to_host(got.data, m * ldc), r = to_host(rounded.data, m * ldc);
        // A GPU's fp32 C: its sums in another order by up to k roundings of terms under 1.
        const double ulp = narrow_c ? (p == Precision::bf16 ? 1.0 / 128 : 1.0 / 1024) : 1e-6,
                     floor = narrow_c ? 1e-30 : double(k) * 6e-8;
        std::int64_t off = 0, tail_written = 0;
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            const float got_v = g[i * ldc + j], want = r[i * ldc + j];
            if (exact ? got_v != want : std::fabs(got_v - want) > ulp * std::fabs(want) + floor) ++off;
          }
          for (std::int64_t j = n; j < ldc; ++j) tail_written += g[i * ldc + j] != 7.0f;
        }
        EXPECT_EQ(off, 0) << "of " << m * n << (exact ? " not the reference's bits" : " beyond one rounding");
        EXPECT_EQ(tail_written, 0) << "elements past C's columns written";
      }
}

// gemm_epilogue (model/gemm.hpp): each epilogue a linear layer and a transformer
// block ask for (bias; relu; the GELU, tanh and exact, with and without a bias, its
// input kept; the GELU's gradient from a stored input; a residual added, with and
// without a bias, C fp32), C fp32 or narrow, against the
// same in double from the operands' values: the product, the bias added, the
// activation, rounded once to C's type. The host makes the product in fp32 and
// rounds a narrow C once, after the epilogue: within one rounding of C's type (2^-8
// relative for bf16, 2^-11 for fp16) plus 1e-5 of the largest value for the fp32
// sums. A GPU's cuBLASLt may take the bias in C's type (u |bias| more) and computes
// its GELU its own way (1e-3 of the largest value for those); the epilogues it does
// not have (relu, the exact GELU) are the GEMM's narrow C and a pass after it: the
// product rounded too there. The host's bits where C is rounded twice fail it.
namespace {
double gelu_reference(double x, bool tanh_form) {
  return tanh_form ? 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
                   : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double gelu_grad_reference(double x, bool tanh_form) {
  if (tanh_form) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
  }
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
}  // namespace

TEST(GemmEpilogue, EachKindAsItsStepsRoundedOnce) {
  using Act = GemmEpilogue::Act;
  struct Kind {
    const char* name;
    Act act;
    bool tanh, bias, add = false;
    bool bias_off = false;  // the bias 4 bytes past 16 (as a slice of the packed parameters may lie)
  };
  const Kind kinds[] = {{"bias", Act::none, false, true},
                        {"bias relu", Act::relu, false, true},
                        {"bias gelu tanh", Act::gelu, true, true},
                        {"gelu tanh", Act::gelu, true, false},
                        {"bias gelu", Act::gelu, false, true},
                        {"dgelu tanh", Act::dgelu, true, false},
                        {"dgelu", Act::dgelu, false, false},
                        {"bias residual", Act::none, false, true, true},
                        {"residual", Act::none, false, false, true},
                        {"bias off 16 bytes", Act::none, false, true, false, true},
                        {"bias gelu tanh, bias off 16 bytes", Act::gelu, true, true, false, true}};
  const std::int64_t m = 37, n = 24, k = 40;  // n a multiple of 8: cuBLASLt's GELU input wants it
  const bool device = compute_backend().gemm_takes_stored();
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (bool narrow_c : {false, true}) {
      if (narrow_c && p == Precision::fp32) continue;
      const Precision c_type = narrow_c ? p : Precision::fp32;
      const double u = c_type == Precision::bf16 ? 1.0 / 256 : c_type == Precision::fp16 ? 1.0 / 2048 : 0.0;
      for (const Kind& kind : kinds) {
        if (kind.add && narrow_c) continue;  // a residual sum is fp32
        SCOPED_TRACE(std::string(kind.name) + ", " + precision_name(p) +
                     (narrow_c ? ", C narrow" : ", C fp32"));
        const bool backward = kind.act == Act::dgelu;
        // Forward: y (m, n) = x (m, k) W^T, x stored narrow where C is, W fp32 (n, k).
        // Backward: dx (m, n) = dy (m, k) W, dy as C, W fp32 (k, n). The fp32 operands
        // hold values of p, so that the GEMM's rounding of them to p is exact.
        const Precision a_type = narrow_c ? p : Precision::fp32;
        const auto [a, a_wide] = narrow_and_wide(m, {k}, Layout::nchw, p, 81);
        const auto [b, b_wide] = narrow_and_wide(backward ? k : n, {backward ? n : k}, Layout::nchw, p, 82);
        Tensor bias, pre, c;
        resize(bias, n + 1, {}, "test::bias");
        from_host(bias.data, random_values(n + 1, 83));
        const std::int64_t bias_at = kind.bias_off ? 1 : 0;
        {  // dgelu's input, over [-4, 4], where the two forms' slopes differ by up to 8e-4
          Tensor given;
          resize(given, m, {n}, "test::given");
          from_host(given.data, random_values(m * n, 84, -4.0f, 4.0f));
          convert_type(given, pre, c_type, "test::pre");
        }
        resize(c, m, {n}, "test::c", Layout::nchw, c_type);
        GemmEpilogue e;
        e.act = kind.act;
        e.tanh = kind.tanh;
        e.bias = kind.bias ? bias.data.data() + bias_at : nullptr;
        e.pre = (kind.act == Act::gelu || backward) ? pre.data.data() : nullptr;
        Tensor add;  // the residual: (m, n) fp32
        resize(add, m, {n}, "test::add");
        from_host(add.data, random_values(m * n, 85, -2.0f, 2.0f));
        e.add = kind.add ? add.data.data() : nullptr;
        kernel_trace::start_counting();
        gemm_epilogue(false, !backward, int(m), int(n), int(k), (narrow_c ? a : a_wide).data.data(), int(k),
                      b_wide.data.data(), int(backward ? n : k), c.data.data(), int(n), p,
                      {a_type, Precision::fp32, c_type}, e);
        const kernel_trace::Dispatches dispatched = kernel_trace::stop_counting();
        std::int64_t passes = 0;
        for (const auto& [label, count] : dispatched.kernels)
          if (label.rfind("gemm_epilogue::", 0) == 0) passes += count;
        const std::vector<float> av = to_host(a_wide.data, m * k), bv = to_host(b_wide.data, n * k),
                                 biasv = to_host(bias.data, n + 1), addv = to_host(add.data, m * n),
                                 prev = values(pre), got = values(c);
        std::vector<double> want(m * n), want_pre(m * n), product(m * n);
        double largest = 0.0;
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double prod = 0.0;
            for (std::int64_t l = 0; l < k; ++l)
              prod += double(av[i * k + l]) * double(backward ? bv[l * n + j] : bv[j * k + l]);
            const double v = prod + (kind.bias ? double(biasv[bias_at + j]) : 0.0);
            product[i * n + j] = prod;
            want_pre[i * n + j] = v;
            want[i * n + j] = kind.act == Act::none   ? v + (kind.add ? double(addv[i * n + j]) : 0.0)
                              : kind.act == Act::relu ? std::max(v, 0.0)
                              : kind.act == Act::gelu
                                  ? gelu_reference(v, kind.tanh)
                                  : prod * gelu_grad_reference(prev[i * n + j], kind.tanh);
            largest = std::max(largest, std::fabs(want[i * n + j]));
          }
        // The device's own ways: the epilogues cuBLASLt has (a bias, the tanh GELU and
        // its gradient) may take the bias rounded to C's type and compute the GELU
        // otherwise; the rest round the product (GELU's slope at most 1.13) before the pass.
        // Beyond the bias and the residual (C at beta 1), which PyTorch's addmm takes
        // from cuBLASLt at every type, the
        // heuristics may offer nothing for a kind (fp32's GELU, say): the fallback then
        // ran, one pass, checked as such, and said (DDP_CUBLASLT_LOG=1 tells why).
        const bool lt_has = device && (kind.act == Act::none || kind.tanh),
                   must_fuse = lt_has && kind.act == Act::none,
                   fused_on_device = lt_has && (must_fuse || passes == 0);
        if (lt_has && !fused_on_device)
          std::printf("note: cuBLASLt declined %s (%s, C %s): its fallback checked\n", kind.name,
                      precision_name(p), precision_name(c_type));
        // cuBLASLt's GELU its own way: 1e-3 of each value and 1e-4, under the two forms'
        // difference (4.6e-4 at -2.7, which the products reach; their slopes' 7.9e-4 at -2).
        const bool gelu_own = fused_on_device && kind.act != Act::none;
        const double product_rounding = device && !fused_on_device ? 1.2 * u : 0.0;
        std::int64_t off = 0, pre_off = 0;
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            const std::int64_t e_ = i * n + j;
            const double bias_rounding = device && kind.bias ? u * std::fabs(biasv[bias_at + j]) : 0.0,
                         own = gelu_own ? 1e-3 * std::fabs(want[e_]) + 1e-4 : 0.0;
            off += std::fabs(got[e_] - want[e_]) > u * std::fabs(want[e_]) +
                                                       product_rounding * std::fabs(product[e_]) +
                                                       bias_rounding + own + 1e-5 * largest;
            if (kind.act == Act::gelu)
              pre_off += std::fabs(prev[e_] - want_pre[e_]) > u * std::fabs(want_pre[e_]) +
                                                                  product_rounding * std::fabs(product[e_]) +
                                                                  bias_rounding + 1e-5 * largest;
          }
        // One pass after the GEMM on the host and where cuBLASLt has not the epilogue
        // or declined it; none where it ran it.
        EXPECT_EQ(passes, fused_on_device ? 0 : 1) << "passes over C after the GEMM";
        EXPECT_EQ(off, 0) << "of " << m * n << " beyond the tolerance";
        EXPECT_EQ(pre_off, 0) << "of the GELU's " << m * n << " inputs beyond one rounding";
      }
    }
}

// A tensor of n elements of `type` holding small integers (exact in every type), and
// its values.
std::pair<Tensor, std::vector<float>> small_integers(std::int64_t n, Precision type, int mul, int mod) {
  std::vector<float> v(n);
  for (std::int64_t e = 0; e < n; ++e) v[e] = float(e * mul % mod - mod / 2);
  Tensor given, t;
  resize(given, n, {}, "test::given");
  from_host(given.data, v);
  convert_type(given, t, type, "test::small_integers");
  return {t, v};
}

// map_vectors (8 elements a load) where `vectors`, else map_runs.
template <class... Args>
void map_runs_or_vectors(bool vectors, Args... args) {
  if (vectors)
    map_vectors(args...);
  else
    map_runs(args...);
}

// map_runs (or map_vectors) on n elements of channel count C (0: flat) against the
// element at a time (a function of its own: CUDA's extended lambdas may not live in a
// test's body).
void check_runs(std::int64_t C, std::int64_t n, bool vectors = false) {
  constexpr float kUntouched = -12345.0f;
  auto [a, va] = small_integers(n, Precision::bf16, 7, 101);
  auto [b, vb] = small_integers(n, Precision::fp16, 13, 61);
  auto [d, vd] = small_integers(n, Precision::fp32, 1, 17);
  const std::int64_t extra = 20;
  Tensor out;
  resize(out, n + extra, {}, "test::out");
  from_host(out.data, std::vector<float>(n + extra, kUntouched));
  if (vectors) {  // what map_elements and map_flat ask before they take map_vectors
    set_element_vectors(true);
    EXPECT_TRUE(vectors_fit(n, C, NoInput{}, elements<false>(out), elements<true>(a), elements<true>(b),
                            elements<false>(d)));
  }
  map_runs_or_vectors(
      vectors, "test::map_runs", n, C,
      KOKKOS_LAMBDA(std::int64_t c, float x, float y, float z) { return x + 2.0f * y - z + 1000.0f * c; },
      elements<false>(out), elements<true>(a), elements<true>(b), elements<false>(d));
  const std::vector<float> got = to_host(out.data, n + extra);
  std::int64_t wrong = 0;
  for (std::int64_t e = 0; e < n; ++e)
    wrong += got[e] != va[e] + 2.0f * vb[e] - vd[e] + 1000.0f * float(C ? e % C : 0);
  EXPECT_EQ(wrong, 0);
  for (std::int64_t e = n; e < n + extra; ++e)
    EXPECT_EQ(got[e], kUntouched) << "written past the end at " << e;

  // In place, narrow: a += b (what add_shortcut_grad does); and one input alone.
  map_runs_or_vectors(
      vectors, "test::map_runs_in_place", n, C,
      KOKKOS_LAMBDA(std::int64_t, float x, float y) { return x + y; }, elements<true>(a), elements<true>(a),
      elements<true>(b), NoInput{});
  map_runs_or_vectors(
      vectors, "test::map_runs_one", n, C, KOKKOS_LAMBDA(std::int64_t, float x) { return -x; },
      elements<true>(b), elements<true>(b), NoInput{}, NoInput{});
  const std::vector<float> summed = values(a), negated = values(b);
  std::int64_t wrong_sum = 0, wrong_neg = 0;
  for (std::int64_t e = 0; e < n; ++e) {
    wrong_sum += summed[e] != va[e] + vb[e];
    wrong_neg += negated[e] != -vb[e];
  }
  EXPECT_EQ(wrong_sum, 0);
  EXPECT_EQ(wrong_neg, 0);
}

// map_runs (model/planes.hpp), which the element passes over narrow or channels-last
// tensors take, against the element-at-a-time loop it replaces: every element of
// [0, n) written once and nothing after it, with its own channel (e % C, or 0 taken
// flat) and inputs, full runs and a last one cut short, in place too. The values
// are small integers, so every result is exact in each type.
TEST(ElementMaps, RunsWriteEveryElementOnceFromItsChannelAndInputs) {
  for (std::int64_t C : {0, 1, 5, 64})
    for (std::int64_t rows : {1, 7, 8, 9, 126, 1000}) {
      const std::int64_t n = C ? rows * C : rows * 3 + 1;
      SCOPED_TRACE("C " + std::to_string(C) + " n " + std::to_string(n));
      check_runs(C, n);
    }
}

// map_vectors, which the same passes take where C is a multiple of 8 (or n, taken
// flat), the same way: 8 elements a load, runs of 4 pixels, a last one cut short.
TEST(ElementMaps, VectorsWriteEveryElementOnceFromItsChannelAndInputs) {
  for (std::int64_t C : {0, 8, 64})
    for (std::int64_t rows : {1, 3, 4, 5, 126, 1000}) {
      const std::int64_t n = C ? rows * C : rows * 8;
      SCOPED_TRACE("C " + std::to_string(C) + " n " + std::to_string(n));
      check_runs(C, n, true);
    }
}

// An operation of per-channel constants, which map_vectors loads 8 channels at a
// time (ChannelValues::at8, as batch norm's passes do): x k(c) + c.
template <class K = ChannelValues>
struct ScaleByChannel {
  K k;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x) const { return x * k(c) + float(c); }
  KOKKOS_INLINE_FUNCTION ScaleByChannel<ChannelValues8> at8(std::int64_t c0) const {
    return ScaleByChannel<ChannelValues8>{k.at8(c0)};
  }
  bool aligned() const { return k.aligned(); }
};
static_assert(has_at8<ScaleByChannel<>>, "map_vectors takes ScaleByChannel's constants 8 at a time");

// map_elements of ScaleByChannel on `pixels` bf16 pixels of C channels (NHWC), its
// constants from the table's element `offset` on, against the element at a time;
// whether it took map_vectors (constants 16-byte aligned) or map_runs.
void check_channel_constants(std::int64_t C, std::int64_t pixels, std::int64_t offset) {
  View1 table("test::k", C + offset);
  std::vector<float> k(C + offset);
  for (std::int64_t c = 0; c < C + offset; ++c) k[c] = float(c * 5 % 11 - 5);
  from_host(table, k);
  const ScaleByChannel<> op{{table.data() + offset}};
  const std::int64_t n = pixels * C;
  auto [x, vx] = small_integers(n, Precision::bf16, 7, 101);
  Tensor out;
  resize(out, n, {}, "test::out");
  set_element_vectors(true);
  EXPECT_EQ(vectors_fit(n, C, op, elements<false>(out), elements<true>(x), NoInput{}, NoInput{}),
            offset % 4 == 0);
  map_elements("test::scale_by_channel", Layout::nhwc, pixels, C, 1, op, elements<false>(out),
               elements<true>(x));
  const std::vector<float> got = to_host(out.data, n);
  std::int64_t wrong = 0;
  for (std::int64_t e = 0; e < n; ++e) {
    const std::int64_t c = e % C;
    wrong += got[e] != vx[e] * k[c + offset] + float(c);
  }
  EXPECT_EQ(wrong, 0);
}

// An operation's per-channel constants loaded 8 channels at a time by a map_vectors
// thread (once, before its pixels), the same values as channel by channel: each
// element with its own channel's constant, full runs and a last one cut short; where
// the constants are not 16-byte aligned, map_runs instead, with the same results.
TEST(ElementMaps, VectorsLoadChannelConstantsEightAtATime) {
  for (std::int64_t C : {8, 64, 200})
    for (std::int64_t pixels : {1, 4, 5, 127})
      for (std::int64_t offset : {0, 1, 4}) {
        SCOPED_TRACE("C " + std::to_string(C) + " pixels " + std::to_string(pixels) + " offset " +
                     std::to_string(offset));
        check_channel_constants(C, pixels, offset);
      }
}

// Batch norm's backward terms over x, dy and y (the relu's mask) for the sums.
struct MaskedDy {
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t, float, float dy, float y = 1.0f) const {
    return y > 0.0f ? double(dy) : 0.0;
  }
};
struct MaskedDyXhat {
  Kokkos::View<float*> mean, invstd;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t c, float x, float dy, float y = 1.0f) const {
    return (y > 0.0f ? double(dy) : 0.0) * ((x - mean(c)) * invstd(c));
  }
};

// The channels-last partial sums of plane_sums_nhwc_vectors and of plane_sums_nhwc
// (rows of C channels, f's then g's), bit for bit, for inputs x (bf16), dy (of
// dy_type) and y (bf16), or x alone.
void check_sums_vectors(std::int64_t B, std::int64_t C, std::int64_t hw, Precision dy_type, bool three) {
  Tensor x, dy, y;
  std::tie(x, std::ignore) = narrow_and_wide(B, {C, 1, hw}, Layout::nhwc, Precision::bf16, 5);
  std::tie(y, std::ignore) = narrow_and_wide(B, {C, 1, hw}, Layout::nhwc, Precision::bf16, 6);
  if (dy_type == Precision::fp32) {
    resize(dy, B, {C, 1, hw}, "test::dy", Layout::nhwc);
    from_host(dy.data, random_values(dy.storage_numel(), 7));
  } else {
    std::tie(dy, std::ignore) = narrow_and_wide(B, {C, 1, hw}, Layout::nhwc, dy_type, 7);
  }
  const std::int64_t n = 2 * partial_rows(Layout::nhwc, B, hw) * C;
  Kokkos::View<double*> one("test::one_a_load", n), eight("test::eight_a_load", n);
  const auto xv = elements<true>(std::as_const(x));
  const auto yv = elements<true>(std::as_const(y));
  if (three) {
    MaskedDyXhat dy_xhat{Kokkos::View<float*>("test::mean", C), Kokkos::View<float*>("test::invstd", C)};
    from_host(dy_xhat.mean, random_values(C, 8));
    from_host(dy_xhat.invstd, random_values(C, 9, 0.5f, 2.0f));
    const auto run = [&](auto dyv) {
      plane_sums_nhwc("test::sums", B, C, hw, one, MaskedDy{}, dy_xhat, xv, dyv, yv);
      plane_sums_nhwc_vectors("test::sums", B, C, hw, eight, MaskedDy{}, dy_xhat, xv, dyv, yv);
    };
    if (dy_type == Precision::fp32)
      run(elements<false>(std::as_const(dy)));
    else
      run(elements<true>(std::as_const(dy)));
  } else {
    auto f = KOKKOS_LAMBDA(std::int64_t, float v) { return double(v); };
    auto g = KOKKOS_LAMBDA(std::int64_t c, float v) { return double(v) * v + double(c); };
    plane_sums_nhwc("test::sums", B, C, hw, one, f, g, xv, NoInput{}, NoInput{});
    plane_sums_nhwc_vectors("test::sums", B, C, hw, eight, f, g, xv, NoInput{}, NoInput{});
  }
  const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), one);
  const auto v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eight);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) differ += std::memcmp(&a(i), &v(i), sizeof(double)) != 0;
  EXPECT_EQ(differ, 0) << "of " << n << " partial sums";
  // The rows of f's partial sums add up to the sum of its terms (the inputs reached them).
  const std::vector<float> hx = values(x), hdy = values(dy), hy = values(y);
  const std::int64_t rows = partial_rows(Layout::nhwc, B, hw);
  for (std::int64_t c = 0; c < C; ++c) {
    double want = 0.0, got = 0.0;
    for (std::int64_t e = c; e < B * hw * C; e += C) want += three ? (hy[e] > 0.0f ? hdy[e] : 0.0) : hx[e];
    for (std::int64_t r = 0; r < rows; ++r) got += a(r * C + c);
    EXPECT_NEAR(got, want, 1e-9 * (1.0 + std::abs(want))) << "channel " << c;
  }
}

// Batch norm's channels-last sums with 8 channels a load: each channel's values added
// in the order of the one-a-load kernel, so the same partial sums bit for bit (runs
// of 32 pixels whole and cut short, fewer pixels than a run, runs ending between
// the loads of 4 pixels); narrow and fp32 dy, and x alone as in the forward sums.
TEST(ElementMaps, ChannelSumsWithVectorsEqualOneLoadAnElement) {
  for (const auto& [B, C, hw] :
       {std::array<std::int64_t, 3>{2, 8, 49}, {3, 24, 3}, {1, 64, 100}, {4, 16, 33}, {2, 8, 1}})
    for (Precision dy_type : {Precision::fp32, Precision::fp16, Precision::bf16})
      for (bool three : {true, false}) {
        if (!three && dy_type != Precision::fp32) continue;
        SCOPED_TRACE("B " + std::to_string(B) + " C " + std::to_string(C) + " hw " + std::to_string(hw) +
                     (three ? " x, dy, y" : " x"));
        check_sums_vectors(B, C, hw, dy_type, three);
      }
}

// How many of narrow's elements are not wide's rounded to narrow's type, bit for bit.
std::size_t not_rounded(const Tensor& narrow, const Tensor& wide) {
  EXPECT_NE(narrow.type, Precision::fp32);
  EXPECT_EQ(wide.type, Precision::fp32);
  const std::vector<float> n = values(narrow), w = to_host(wide.data, wide.storage_numel());
  std::size_t off = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const float r = narrow.type == Precision::bf16 ? round_bf16(w[i]) : round_fp16(w[i]);
    off += float_bits(n[i]) != float_bits(r);
  }
  return off;
}

void check_batchnorm(Precision type, Layout layout, bool relu) {
  const Shape sample = {5, 6, 7};
  const std::int64_t B = 3;
  BoundLayer narrow("batchnorm2d", sample), wide("batchnorm2d", sample);
  if (relu) {
    dynamic_cast<BatchNorm2d&>(*narrow.layer).fuse_relu();
    dynamic_cast<BatchNorm2d&>(*wide.layer).fuse_relu();
  }
  auto [xn, xw] = narrow_and_wide(B, sample, layout, type, 11);
  auto [dyn, dyw] = narrow_and_wide(B, sample, layout, type, 12);
  Tensor yn, yw, dxn, dxw;
  narrow.layer->forward(xn, yn, true);
  wide.layer->forward(xw, yw, true);
  ASSERT_EQ(yn.type, type);
  EXPECT_EQ(not_rounded(yn, yw), 0u);
  narrow.layer->backward(xn, yn, dyn, dxn);
  wide.layer->backward(xw, yw, dyw, dxw);
  ASSERT_EQ(dxn.type, type);
  EXPECT_EQ(not_rounded(dxn, dxw), 0u);
  EXPECT_EQ(to_host(narrow.grads, narrow.n), to_host(wide.grads, wide.n));
  EXPECT_EQ(to_host(narrow.buffers, narrow.nbuf), to_host(wide.buffers, wide.nbuf));
  // In eval, on the running statistics: backward's dx then has a pass of its own.
  narrow.layer->forward(xn, yn, false);
  wide.layer->forward(xw, yw, false);
  EXPECT_EQ(not_rounded(yn, yw), 0u);
  narrow.layer->backward(xn, yn, dyn, dxn);
  wide.layer->backward(xw, yw, dyw, dxw);
  EXPECT_EQ(not_rounded(dxn, dxw), 0u);
}

TEST(NarrowElements, BatchNormWritesItsFp32ResultsRounded) {
  for (Precision type : {Precision::bf16, Precision::fp16})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(precision_name(type)) + " " + layout_name(layout) + (relu ? " relu" : ""));
        check_batchnorm(type, layout, relu);
      }
}

// Batch norm's fused relu in backward: the mask y > 0 read from the output (the
// default) against bn(x) > 0 taken again from x (DDP_BN_RELU_MASK=input): the same
// dx and parameter gradients bit for bit, in training and in eval, fp32 and narrow,
// channels-last with and without 8 channels a load (C = 8), and where C is not a
// multiple of 8. (They could differ only where a narrow output rounds a positive
// value to 0: fp16 below 3e-8, which these values do not reach.)
TEST(ElementMaps, BatchNormReluMaskFromInputEqualsFromOutput) {
  const auto bits = [](const std::vector<float>& a) {
    std::vector<std::uint32_t> u(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) u[i] = float_bits(a[i]);
    return u;
  };
  for (Precision type : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (std::int64_t C : {8, 5})
        for (bool vectors : {true, false}) {
          SCOPED_TRACE(std::string(precision_name(type)) + " " + layout_name(layout) + " C " +
                       std::to_string(C) + (vectors ? " vectors" : ""));
          set_element_vectors(vectors);
          const Shape sample = {C, 6, 7};
          const std::int64_t B = 3;
          auto [xn, xw] = narrow_and_wide(B, sample, layout, type, 31);
          auto [dyn, dyw] = narrow_and_wide(B, sample, layout, type, 32);
          const Tensor& x = type == Precision::fp32 ? xw : xn;
          const Tensor& dy = type == Precision::fp32 ? dyw : dyn;
          std::vector<std::vector<float>> got[2];
          for (bool from_input : {false, true}) {
            set_bn_relu_mask_from_input(from_input);
            BoundLayer l("batchnorm2d", sample);
            dynamic_cast<BatchNorm2d&>(*l.layer).fuse_relu();
            Tensor y, dx, y_eval, dx_eval;
            l.layer->forward(x, y, true);
            l.layer->backward(x, y, dy, dx);
            const std::vector<float> grads = to_host(l.grads, l.n);
            l.layer->forward(x, y_eval, false);
            l.layer->backward(x, y_eval, dy, dx_eval);
            got[from_input] = {values(dx), grads, values(dx_eval)};
          }
          set_bn_relu_mask_from_input(false);
          EXPECT_EQ(bits(got[0][0]), bits(got[1][0])) << "dx";
          EXPECT_EQ(bits(got[0][1]), bits(got[1][1])) << "gamma and beta's gradients";
          EXPECT_EQ(bits(got[0][2]), bits(got[1][2])) << "dx in eval";
          std::size_t zero = 0;  // the mask holds some back, not all (eval's dx: 0 where it does)
          for (float d : got[0][2]) zero += d == 0.0f;
          EXPECT_GT(zero, got[0][2].size() / 5);
          EXPECT_LT(zero, got[0][2].size() * 4 / 5);
        }
  set_element_vectors(true);
}

// A convolution at precision p reading and writing narrow tensors against the same
// convolution on fp32 tensors of the same values. Its operands are p's values either
// way, so the weight gradient is the same and y, dx are the fp32 ones rounded: on the
// host (and on the GPU here, DDP_CUDNN_NARROW=0) the layer widens and narrows around
// the fp32 kernels.
void check_conv(Precision p) {
  const std::string spec = "conv2d(12, 3, stride=2, pad=1, bias=false)";
  const Shape sample = {6, 9, 8};
  const std::int64_t B = 3;
  BoundLayer narrow(spec, sample), wide(spec, sample);
  auto& cn = dynamic_cast<Conv2d&>(*narrow.layer);
  auto& cw = dynamic_cast<Conv2d&>(*wide.layer);
  cn.set_precision(p);
  cw.set_precision(p);
  const Layout layout = cn.native_input_layout() == Layout::nhwc ? Layout::nhwc : Layout::nchw;
  cn.set_layouts(layout, layout);
  cw.set_layouts(layout, layout);
  cn.set_types(p, p);
  auto [xn, xw] = narrow_and_wide(B, sample, layout, p, 21);
  auto [dyn, dyw] = narrow_and_wide(B, narrow.out_sample, layout, p, 22);
  Tensor yn, yw, dxn, dxw;
  cn.forward(xn, yn, true);
  cw.forward(xw, yw, true);
  ASSERT_EQ(yn.type, p);
  EXPECT_EQ(not_rounded(yn, yw), 0u);
  cn.backward(xn, yn, dyn, dxn);
  cw.backward(xw, yw, dyw, dxw);
  ASSERT_EQ(dxn.type, p);
  EXPECT_EQ(not_rounded(dxn, dxw), 0u);
  EXPECT_EQ(to_host(narrow.grads, narrow.n), to_host(wide.grads, wide.n));
}

TEST(NarrowElements, Conv2dWritesItsResultsRounded) {
  check_conv(Precision::bf16);
  check_conv(Precision::fp16);
}

// Conv2d::set_accumulate_input_grad (a residual block's two gradients of its input):
// dx += conv^T(dy) onto what dx holds, against the gradient written alone plus dx's
// values (add_elements). The same floats where the layer adds after the kernel (the
// host; narrow types here, whose kernels run on widened copies); within fp32's
// rounding of the sum where the kernel adds as it writes (cuDNN's beta = 1 on an fp32
// dx, the GPU build).
void check_conv_adds(Precision p) {
  const std::string spec = "conv2d(12, 3, stride=2, pad=1, bias=false)";
  const Shape sample = {6, 9, 8};
  const std::int64_t B = 3;
  BoundLayer bound(spec, sample);
  auto& conv = dynamic_cast<Conv2d&>(*bound.layer);
  conv.set_precision(p);
  const Layout layout = conv.native_input_layout() == Layout::nhwc ? Layout::nhwc : Layout::nchw;
  conv.set_layouts(layout, layout);
  conv.set_types(p, p);
  auto [x, xw] = narrow_and_wide(B, sample, layout, p, 31);
  auto [dy, dyw] = narrow_and_wide(B, bound.out_sample, layout, p, 32);
  auto [prior, prior_wide] = narrow_and_wide(B, sample, layout, p, 33);
  Tensor y, alone, sum, want;
  conv.forward(x, y, true);
  conv.backward(x, y, dy, alone);
  convert_type(prior, sum, p, "test::sum");  // a copy of prior
  convert_type(prior, want, p, "test::want");
  conv.set_accumulate_input_grad(true);
  conv.backward(x, y, dy, sum);
  add_elements("test::add", alone, want);
  const std::vector<float> got = values(sum), expected = values(want);
  EXPECT_GT(norm_relative_error(got, values(alone)), 0.1) << "dx's values were not added";
  if (compute_backend().device_memory() && p == Precision::fp32)
    EXPECT_LT(norm_relative_error(got, expected), 1e-6);
  else
    EXPECT_EQ(got, expected);
  // The flag stays with the layer until unset: written again, dx is the gradient alone.
  conv.set_accumulate_input_grad(false);
  conv.backward(x, y, dy, sum);
  EXPECT_EQ(values(sum), values(alone));
}

TEST(NarrowElements, Conv2dAddsItsInputGradientToDx) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    check_conv_adds(p);
  }
}

// A max-pool on an nhwc x of type p against the same pool on fp32 tensors of the same
// values: y is the same elements (a max rounds nothing), dx the fp32 one rounded (the
// sums where 3x3 windows at stride 2 overlap are rounded once), with and without the
// relu mask it takes over from a relu before it.
TEST(NarrowElements, MaxPoolKeepsItsInputsType) {
  const Shape sample = {6, 9, 8};
  const std::int64_t B = 3;
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (bool relu : {false, true}) {
      SCOPED_TRACE(std::string(precision_name(p)) + (relu ? " relu" : ""));
      BoundLayer narrow("maxpool(3, stride=2, pad=1)", sample), wide("maxpool(3, stride=2, pad=1)", sample);
      for (BoundLayer* l : {&narrow, &wide}) {
        auto& pool = dynamic_cast<Pool2d&>(*l->layer);
        pool.set_layouts(Layout::nhwc, Layout::nhwc);
        if (relu) pool.absorb_relu_backward();
      }
      auto [xn, xw] = narrow_and_wide(B, sample, Layout::nhwc, p, 41);
      auto [dyn, dyw] = narrow_and_wide(B, narrow.out_sample, Layout::nhwc, p, 42);
      Tensor yn, yw, dxn, dxw;
      narrow.layer->forward(xn, yn, true);
      wide.layer->forward(xw, yw, true);
      ASSERT_EQ(yn.type, p);
      EXPECT_EQ(values(yn), to_host(yw.data, yw.storage_numel()));
      narrow.layer->backward(xn, yn, dyn, dxn);
      wide.layer->backward(xw, yw, dyw, dxw);
      ASSERT_EQ(dxn.type, p);
      EXPECT_EQ(not_rounded(dxn, dxw), 0u);
      const std::vector<float> dx = values(dxn);
      std::size_t nonzero = 0, sums = 0;
      for (std::size_t i = 0; i < dx.size(); ++i) nonzero += dx[i] != 0.0f;
      const std::vector<float> dy = values(dyn);
      for (float d : dx) sums += std::find(dy.begin(), dy.end(), d) == dy.end() && d != 0.0f;
      EXPECT_GT(nonzero, 0u);
      EXPECT_GT(sums, 0u) << "no element of dx sums two windows' gradients";
    }
}

// The channels-last max-pool with 8 channels a load (Pool2d::nhwc_vectors) against
// one channel a thread, bit for bit: y, and dx (which reads the argmax), for windows
// that take the loaded path (3 at stride 2, 2 at 2) and the loop (3 at 1: 3 windows
// over a pixel; 5 at 2), ties (values of 5 kinds) and NaN, the relu's mask, y
// channels-last and NCHW, bf16 and fp32.
TEST(ElementMaps, MaxPoolWithVectorsEqualsOneLoadAChannel) {
  const std::int64_t B = 2;
  for (const char* spec : {"maxpool(3, stride=2, pad=1)", "maxpool(2)", "maxpool(3, stride=1, pad=1)",
                           "maxpool(5, stride=2, pad=2)"})
    for (std::int64_t C : {8, 24})
      for (Precision p : {Precision::bf16, Precision::fp32})
        for (bool relu : {false, true})
          for (Layout out : {Layout::nhwc, Layout::nchw}) {
            SCOPED_TRACE(std::string(spec) + " C " + std::to_string(C) + " " + precision_name(p) +
                         (relu ? " relu" : "") + (out == Layout::nhwc ? " nhwc y" : " nchw y"));
            const Shape sample = {C, 9, 10};
            Tensor given, x, dy;
            resize(given, B, sample, "test::given", Layout::nhwc);
            std::vector<float> v(given.storage_numel());
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(int(i * 7 % 5) - 2);
            if (p == Precision::fp32) v[17] = v[101] = std::numeric_limits<float>::quiet_NaN();
            from_host(given.data, v);
            convert_type(given, x, p, "test::x");
            std::vector<std::vector<float>> got[2];
            for (bool vectors : {false, true}) {
              set_element_vectors(vectors);
              BoundLayer l(spec, sample);
              auto& pool = dynamic_cast<Pool2d&>(*l.layer);
              pool.set_layouts(Layout::nhwc, out);
              if (relu) pool.absorb_relu_backward();
              Tensor y, dx;
              l.layer->forward(x, y, true);
              EXPECT_EQ(pool.nhwc_vectors(x, y), vectors);
              Tensor dy_given;
              resize(dy_given, B, l.out_sample, "test::dy", out);
              from_host(dy_given.data, random_values(dy_given.storage_numel(), 43));
              convert_type(dy_given, dy, p, "test::dy");
              l.layer->backward(x, y, dy, dx);
              got[vectors] = {values(y), values(dx)};
            }
            set_element_vectors(true);
            const auto bits = [](const std::vector<float>& a) {
              std::vector<std::uint32_t> u(a.size());
              for (std::size_t i = 0; i < a.size(); ++i) u[i] = float_bits(a[i]);
              return u;
            };
            EXPECT_EQ(bits(got[1][0]), bits(got[0][0])) << "y";
            EXPECT_EQ(bits(got[1][1]), bits(got[0][1])) << "dx";
            std::size_t nonzero = 0;
            for (float d : got[1][1]) nonzero += d != 0.0f;
            EXPECT_GT(nonzero, got[1][1].size() / 20) << "dx";
          }
}

// globalavgpool on an nhwc x of type p: y (fp32) the same as from the fp32 twin (the
// same sums in the same order), dx the fp32 one rounded.
TEST(NarrowElements, GlobalAvgPoolReadsAndWritesNarrow) {
  const Shape sample = {6, 5, 7};
  const std::int64_t B = 3;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    BoundLayer narrow("globalavgpool", sample), wide("globalavgpool", sample);
    auto [xn, xw] = narrow_and_wide(B, sample, Layout::nhwc, p, 51);
    Tensor dy, yn, yw, dxn, dxw;
    resize(dy, B, narrow.out_sample, "test::dy");
    from_host(dy.data, random_values(dy.numel(), 52));
    narrow.layer->forward(xn, yn, true);
    wide.layer->forward(xw, yw, true);
    EXPECT_EQ(yn.type, Precision::fp32);
    EXPECT_EQ(to_host(yn.data, yn.numel()), to_host(yw.data, yw.numel()));
    narrow.layer->backward(xn, yn, dy, dxn);
    wide.layer->backward(xw, yw, dy, dxw);
    ASSERT_EQ(dxn.type, p);
    EXPECT_EQ(dxn.layout, Layout::nhwc);
    EXPECT_EQ(not_rounded(dxn, dxw), 0u);
  }
}

// How far a's results are from b's (norm_relative_error of each).
struct Distance {
  double y, dx, grads;
};
Distance distance(const ChainResults& a, const ChainResults& b) {
  return {norm_relative_error(a.y, b.y), norm_relative_error(a.dx, b.dx),
          norm_relative_error(a.grads, b.grads)};
}

// A bottleneck with a projection keeping its activations inside narrow, its input
// and output fp32.
TEST(NarrowElements, BottleneckKeepsItsActivationsNarrow) {
  const std::vector<std::string> specs = {"bottleneck(4, stride=2)"};
  const Shape sample = {8, 9, 9};
  const ChainResults exact = run_blocks(Precision::fp32, false, specs, sample);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    const ChainResults narrow = run_blocks(p, true, specs, sample),
                       wide = run_blocks(p, false, specs, sample);
    if (compute_backend().narrow_convolution_results(p)) {
      // cuDNN's narrow kernels: the fp32 block rounds every activation a convolution
      // reads and widens every one it writes, so the narrow one stores the same values.
      EXPECT_EQ(narrow.y, wide.y);
      EXPECT_EQ(narrow.dx, wide.dx);
      EXPECT_EQ(narrow.grads, wide.grads);
      continue;
    }
    // Host: the convolutions write fp32, which the narrow block stores rounded before
    // each batch norm and convolution. That moves the block by about as much as p's
    // operands do against fp32 (in this small block with few values per channel, a
    // relu that flips on a rounding moves dx by 16% in bf16, 0.05% in fp16): not more
    // than twice that.
    const Distance moved = distance(narrow, wide), by_operands = distance(wide, exact);
    EXPECT_LT(moved.y, 2 * by_operands.y);
    EXPECT_LT(moved.dx, 2 * by_operands.dx);
    EXPECT_LT(moved.grads, 2 * by_operands.grads);
    EXPECT_GT(moved.y, 0.0) << "the activations inside were not narrowed";
  }
}

// Blocks in a row handing their activations and gradients on narrow: also the
// gradient of each block's output and the sum in each dx are rounded (as in PyTorch's
// AMP), and the results move more. bf16: not more than twice as far from the fp32
// blocks as bf16 operands alone take them. fp16, whose roundings are 8 times finer
// but whose rarer relu flips are each as large: closer to fp32 than bf16 operands.
TEST(NarrowElements, BlocksHandTheirActivationsOnNarrow) {
  const std::vector<std::pair<std::vector<std::string>, Shape>> chains = {
      {{"bottleneck(4, stride=2)", "bottleneck(4)", "bottleneck(8, stride=2)"}, {8, 9, 9}},
      {{"resblock(8)", "resblock(8)"}, {8, 7, 7}}};  // identity shortcuts at both ends
  for (const auto& [specs, sample] : chains) {
    SCOPED_TRACE(specs.front() + " ...");
    const ChainResults exact = run_blocks(Precision::fp32, false, specs, sample),
                       bf16 = run_blocks(Precision::bf16, false, specs, sample),
                       bf16_narrow = run_blocks(Precision::bf16, true, specs, sample),
                       fp16_narrow = run_blocks(Precision::fp16, true, specs, sample);
    const Distance by_operands = distance(bf16, exact), bf16_off = distance(bf16_narrow, exact),
                   fp16_off = distance(fp16_narrow, exact);
    EXPECT_LT(bf16_off.y, 2 * by_operands.y);
    EXPECT_LT(bf16_off.dx, 2 * by_operands.dx);
    EXPECT_LT(bf16_off.grads, 2 * by_operands.grads);
    EXPECT_LT(fp16_off.y, by_operands.y);
    EXPECT_LT(fp16_off.dx, by_operands.dx);
    EXPECT_LT(fp16_off.grads, by_operands.grads);
    EXPECT_GT(distance(bf16_narrow, bf16).dx, 0.0) << "nothing was narrowed";
    std::printf(
        "%s ...: from fp32, bf16 operands y %.1e dx %.1e grads %.1e; bf16 narrow %.1e %.1e %.1e; "
        "fp16 narrow %.1e %.1e %.1e\n",
        specs.front().c_str(), by_operands.y, by_operands.dx, by_operands.grads, bf16_off.y, bf16_off.dx,
        bf16_off.grads, fp16_off.y, fp16_off.dx, fp16_off.grads);
  }
}

// A whole model at precision p with its activations kept narrow where its layers
// allow (Model::plan_narrow_activations: the plan of the GPU's narrow cuDNN path, on
// any backend) or not: the output and the gradients after one step, and the type
// of each layer's output.
struct ModelResults {
  std::vector<float> y, grads;
  std::vector<Precision> types;
  std::vector<Layout> layouts;
  std::int64_t activation_floats = 0;
};
ModelResults run_model(Precision p, bool narrow, const std::vector<std::string>& specs, const Shape& sample) {
  const std::int64_t B = 4;
  Model m(specs, sample, 5);
  m.set_precision(p);
  m.plan_narrow_activations(narrow);
  Tensor x, dout;
  resize(x, B, sample, "test::x");
  from_host(x.data, random_values(x.numel(), 61));
  const Tensor& y = m.forward(x, true);
  resize(dout, B, {y.shape.begin() + 1, y.shape.end()}, "test::dout");
  from_host(dout.data, random_values(dout.numel(), 62));
  m.zero_grad();
  m.backward(dout, nullptr);
  ModelResults r{
      to_host(y.data, y.numel()), to_host(m.gradients(), m.num_parameters()), {}, {}, m.activation_floats(B)};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    r.types.push_back(m.output_type(i));
    r.layouts.push_back(m.output_layout(i));
  }
  if (narrow) {
    EXPECT_NE(m.summary().find(precision_name(p)), std::string::npos) << m.summary();
  }
  return r;
}

// The plan: narrow from the first convolution (no bias) through batch norms, the
// relus they fuse, a second convolution and two blocks, up to the global pool where
// that reads the blocks' layout narrow (nhwc: the GPU's narrow path), else fp32 from
// the last block's output on; after the pool fp32. The same model with a 3x3
// max-pool after the stem: where the pool reads nchw (not nhwc), no narrow max-pool,
// so the stem falls back to fp32 as a whole (a batch norm keeps its input's type). The
// numbers: bf16 kept narrow within twice the distance from fp32 that bf16 operands
// alone give, fp16 within bf16 operands' distance; the activations planned smaller
// where the convolutions take narrow sides (a GPU's), larger where they run on fp32
// copies of them (the host's).
TEST(NarrowElements, ModelKeepsItsActivationsNarrowFromConvolutionToPool) {
  const std::vector<std::string> stem = {"conv2d(8, 3, pad=1, bias=false)", "batchnorm2d", "relu",
                                         "conv2d(8, 3, pad=1, bias=false)", "batchnorm2d", "relu"},
                                 tail = {"resblock(8)", "resblock(8)", "globalavgpool", "flatten",
                                         "linear(3)"};
  std::vector<std::string> specs = stem;
  specs.insert(specs.end(), tail.begin(), tail.end());
  const Shape sample = {3, 8, 8};
  const ModelResults exact = run_model(Precision::fp32, false, specs, sample),
                     bf16 = run_model(Precision::bf16, false, specs, sample),
                     bf16_narrow = run_model(Precision::bf16, true, specs, sample),
                     fp16_narrow = run_model(Precision::fp16, true, specs, sample);
  // Each precision's own: oneDNN may lay a block's output out otherwise for fp16 than
  // for bf16 (on a CPU with AVX512-FP16 and AMX it does, and the pool then reads nchw).
  const bool bf16_pool_reads_narrow = bf16_narrow.layouts[7] == Layout::nhwc,
             fp16_pool_reads_narrow = fp16_narrow.layouts[7] == Layout::nhwc;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(std::to_string(i) + " " + specs[i] + " (layouts: bf16 " +
                 layout_name(bf16_narrow.layouts[i]) + ", fp16 " + layout_name(fp16_narrow.layouts[i]) + ")");
    EXPECT_EQ(bf16_narrow.types[i],
              i < 7 || (i == 7 && bf16_pool_reads_narrow) ? Precision::bf16 : Precision::fp32);
    EXPECT_EQ(fp16_narrow.types[i],
              i < 7 || (i == 7 && fp16_pool_reads_narrow) ? Precision::fp16 : Precision::fp32);
    EXPECT_EQ(bf16.types[i], Precision::fp32);
  }
  if (compute_backend().narrow_convolution_results(Precision::bf16)) {
    EXPECT_LT(bf16_narrow.activation_floats, bf16.activation_floats);
    EXPECT_GT(2 * bf16_narrow.activation_floats, bf16.activation_floats);
  } else {  // the host's convolutions take fp32 only: they run on fp32 copies of the narrow sides
    EXPECT_GT(bf16_narrow.activation_floats, bf16.activation_floats);
  }
  const double by_operands_y = norm_relative_error(bf16.y, exact.y),
               by_operands_g = norm_relative_error(bf16.grads, exact.grads);
  const double bf16_y = norm_relative_error(bf16_narrow.y, exact.y),
               bf16_g = norm_relative_error(bf16_narrow.grads, exact.grads),
               fp16_y = norm_relative_error(fp16_narrow.y, exact.y),
               fp16_g = norm_relative_error(fp16_narrow.grads, exact.grads);
  std::printf(
      "model from fp32: bf16 operands y %.1e grads %.1e; bf16 narrow %.1e %.1e; fp16 narrow %.1e %.1e\n",
      by_operands_y, by_operands_g, bf16_y, bf16_g, fp16_y, fp16_g);
  EXPECT_LT(bf16_y, 2 * by_operands_y);
  EXPECT_LT(bf16_g, 2 * by_operands_g);
  EXPECT_LT(fp16_y, by_operands_y);
  EXPECT_LT(fp16_g, by_operands_g);
  EXPECT_GT(norm_relative_error(bf16_narrow.grads, bf16.grads), 0.0) << "nothing was narrowed";

  std::vector<std::string> pooled = {stem[0], stem[1], stem[2], "maxpool(3, stride=2, pad=1)"};
  pooled.insert(pooled.end(), tail.begin(), tail.end());
  const ModelResults with_pool = run_model(Precision::bf16, true, pooled, sample);
  const bool pool_keeps = with_pool.layouts[2] == Layout::nhwc;
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(with_pool.types[i], pool_keeps ? Precision::bf16 : Precision::fp32) << i << " " << pooled[i];
  EXPECT_EQ(with_pool.types[4], Precision::bf16) << "the blocks hand on narrow";
}

// Transformer blocks keeping their inner activations narrow where the model keeps
// activations so (TransformerBlock::set_types, the GPU's bf16 and fp16 plan): GPT-2's
// pre-norm blocks (tanh GELU, causal) and ViT's (exact GELU), two in a row, then a
// layer norm and a head. The layer norms' outputs and the MLP's are stored rounded,
// and their gradients; the residual stream stays fp32, so every layer's output does.
// bf16 kept narrow within twice the distance from fp32 that bf16 operands alone give
// (a, c and g are GEMM operands, rounded to bf16 there anyway; f and the gradients
// are the roundings added), fp16 within bf16 operands' distance; the activations
// planned smaller by what the inner ones no longer take.
TEST(NarrowElements, TransformerBlocksKeepTheirInnerActivationsNarrow) {
  const std::vector<std::vector<std::string>> models = {
      {"transformer_block(4, causal, tanh)", "transformer_block(4, causal, tanh)", "layernorm", "linear(5)"},
      {"transformer_block(4, eps=1e-6)", "transformer_block(4, eps=1e-6)", "layernorm", "linear(5)"}};
  const Shape sample = {12, 32};
  for (const auto& specs : models) {
    SCOPED_TRACE(specs.front());
    const ModelResults exact = run_model(Precision::fp32, false, specs, sample),
                       bf16 = run_model(Precision::bf16, false, specs, sample),
                       bf16_narrow = run_model(Precision::bf16, true, specs, sample),
                       fp16_narrow = run_model(Precision::fp16, true, specs, sample);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(bf16_narrow.types[i], Precision::fp32) << i;
      EXPECT_EQ(fp16_narrow.types[i], Precision::fp32) << i;
    }
    // Each block's a and c (N d each, N = B T), f and g (4 N d each), halved; its
    // gradients between the parts (dc, da, df: g's is never stored) halved in the
    // shared slots, which the blocks share. Where the backend keeps narrow copies of
    // GEMM operands (a GPU's), more: the MLP's dy is narrow already, so no copy of it
    // is made.
    const std::int64_t N = 4 * sample[0], d = sample[1], saved = 2 * 10 * N * d / 2 + 6 * N * d / 2;
    if (compute_backend().narrow_copy_floats(N * d, Precision::bf16) == 0)
      EXPECT_EQ(bf16.activation_floats - bf16_narrow.activation_floats, saved);
    else
      EXPECT_GE(bf16.activation_floats - bf16_narrow.activation_floats, saved);
    const Distance by_operands{norm_relative_error(bf16.y, exact.y), 0.0,
                               norm_relative_error(bf16.grads, exact.grads)},
        bf16_off{norm_relative_error(bf16_narrow.y, exact.y), 0.0,
                 norm_relative_error(bf16_narrow.grads, exact.grads)},
        fp16_off{norm_relative_error(fp16_narrow.y, exact.y), 0.0,
                 norm_relative_error(fp16_narrow.grads, exact.grads)};
    std::printf(
        "%s ...: from fp32, bf16 operands y %.1e grads %.1e; bf16 narrow %.1e %.1e; fp16 narrow %.1e %.1e\n",
        specs.front().c_str(), by_operands.y, by_operands.grads, bf16_off.y, bf16_off.grads, fp16_off.y,
        fp16_off.grads);
    EXPECT_LT(bf16_off.y, 2 * by_operands.y);
    EXPECT_LT(bf16_off.grads, 2 * by_operands.grads);
    EXPECT_LT(fp16_off.y, by_operands.y);
    EXPECT_LT(fp16_off.grads, by_operands.grads);
    EXPECT_GT(norm_relative_error(bf16_narrow.grads, bf16.grads), 0.0) << "nothing was narrowed";
  }
}

}  // namespace
}  // namespace ddp
