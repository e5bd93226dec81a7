// Every layer's forward against its definition and its backward against central
// finite differences of L = sum(w * y), for the input and for the parameters.

#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "allocations.hpp"
#include "comm/check.hpp"
#include "grad_check.hpp"
#include "model/activation.hpp"
#include "model/backend.hpp"
#include "model/column_sums.hpp"
#include "model/dropout.hpp"
#include "model/exp_fast.hpp"
#include "model/flatten.hpp"
#include "model/layer_registry.hpp"
#include "model/linear.hpp"
#include "model/model.hpp"
#include "model/planes.hpp"

// Outside the anonymous namespace: nvcc's device lambdas need an enclosing function
// with external linkage.
namespace ddp::exp_fast_check {
// exp_fast of each x, or normal_cdf where `cdf`, computed in a kernel.
std::vector<float> on_device(const std::vector<float>& xs, bool cdf = false) {
  const std::int64_t n = static_cast<std::int64_t>(xs.size());
  View1 xv = make_buffer("ExpFast::x", n), yv = make_buffer("ExpFast::y", n);
  Kokkos::deep_copy(xv, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(xs.data(), n));
  Kokkos::parallel_for(
      "ExpFast::test", Range(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { yv(i) = cdf ? normal_cdf(xv(i)) : exp_fast(xv(i)); });
  return test::to_host(yv, n);
}
}  // namespace ddp::exp_fast_check

namespace ddp::column_sums_check {
// column_sums over the (rows, n) table v on the device, out starting at `init`:
// one term (v) or two (v times 1.5 v rounded to float, in double; then v), as layer
// norm's weight and bias take them. The results and the stretches' sums on the host.
struct Result {
  std::vector<float> out;       // (terms, n)
  std::vector<double> partial;  // (terms, K, n): the stretches' sums
};
Result run(const std::vector<float>& v, std::int64_t rows, std::int64_t n, int terms,
           const std::vector<float>& init, bool add) {
  View1 table = make_buffer("ColumnSums::table", rows * n), out = make_buffer("ColumnSums::out", 2 * n);
  Kokkos::deep_copy(
      table, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(v.data(), rows * n));
  Kokkos::deep_copy(
      out, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(init.data(), 2 * n));
  Kokkos::View<double*> partial;
  const float* t = table.data();
  if (terms == 1) {
    float* const o[1] = {out.data()};
    column_sums<1>(
        "ColumnSums::stretches", "ColumnSums::sums", rows, n, partial,
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
          return Kokkos::Array<double, 1>{double(t[r * n + j])};
        },
        o, add);
  } else {
    float* const o[2] = {out.data(), out.data() + n};
    column_sums<2>(
        "ColumnSums::stretches", "ColumnSums::sums", rows, n, partial,
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
          const float a = t[r * n + j], b = a * 1.5f;
          return Kokkos::Array<double, 2>{double(a) * b, double(a)};
        },
        o, add);
  }
  const std::int64_t K = (rows + stretch_rows(rows) - 1) / stretch_rows(rows);
  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partial);
  return {test::to_host(out, terms * n), std::vector<double>(p.data(), p.data() + terms * K * n)};
}
}  // namespace ddp::column_sums_check

namespace ddp::rows_range_check {
// How many elements of (a, rows, columns) a kernel over rows_range did not visit
// exactly once at their own indices (a = 0: the 2-D range over (rows, columns)).
// Kernels in a function of their own, outside the anonymous namespace, as the
// checks above: CUDA's extended lambdas may not stand in a test's body.
std::int64_t rows_range_misses(std::int64_t a, std::int64_t rows, std::int64_t columns) {
  const std::int64_t n = (a ? a : 1) * rows * columns;
  Kokkos::View<int*> seen("test::seen", std::size_t(n));
  if (a == 0)
    Kokkos::parallel_for(
        "test::rows_range2", rows_range(rows, columns),
        KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) { Kokkos::atomic_add(&seen(r * columns + c), 1); });
  else
    Kokkos::parallel_for(
        "test::rows_range3", rows_range(a, rows, columns),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t r, std::int64_t c) {
          Kokkos::atomic_add(&seen((i * rows + r) * columns + c), 1);
        });
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), seen);
  std::int64_t misses = 0;
  for (std::int64_t i = 0; i < n; ++i) misses += h(i) != 1;
  return misses;
}
}  // namespace ddp::rows_range_check

namespace ddp::planes_check {
// Where channel_sums' `then` sees each channel's sums.
struct Keep {
  Kokkos::View<double*> seen;
  std::int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, double f, double g) const {
    seen(c) = f;
    seen(C + c) = g;
  }
};

// channel_sums of x and x^2 for a (B, C, H, W) tensor x in `layout`: the sums, then
// what `then` saw, on the host. The partial sums get exactly partial_doubles.
std::vector<double> sums_and_seen(const View1& x, Layout layout, std::int64_t B, std::int64_t C,
                                  std::int64_t hw) {
  Kokkos::View<double*> partial("test::partial", partial_doubles(layout, B, C, hw)),
      sums("test::sums", 2 * C), seen("test::seen", 2 * C);
  auto f = KOKKOS_LAMBDA(std::int64_t, float v) { return double(v); };
  auto g = KOKKOS_LAMBDA(std::int64_t, float v) { return double(v) * v; };
  channel_sums("test::channel_sums", "test::channel_sums (rows)", layout, B, C, hw, partial, sums, f, g,
               Keep{seen, C}, Fp32Elements<const float>{x.data()});
  auto s = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums);
  auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), seen);
  std::vector<double> out(s.data(), s.data() + 2 * C);
  out.insert(out.end(), t.data(), t.data() + 2 * C);
  return out;
}
}  // namespace ddp::planes_check

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer's runtime's (sanitizer/allocator_interface.h, which Debian's GCC
// does not ship).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace ddp {
namespace {

using test::make_tensor;
using test::random_values;
using test::to_host;

// A layer with its own parameter/gradient buffers, as the model would bind them.
struct Bound {
  std::unique_ptr<Layer> layer;
  View1 params, grads;
  std::int64_t n = 0;

  Bound(std::unique_ptr<Layer> l, const Shape& in_sample) : layer(std::move(l)) {
    layer->output_shape(in_sample);
    for (const auto& p : layer->parameter_specs()) n += shape_numel(p.shape);
    params = View1("test::params", n);
    grads = View1("test::grads", n);
    layer->bind(params.data(), grads.data());
    Rng rng(1);
    layer->init(rng);
  }
};

// Gradient check of one layer on a (B, in_sample...) input, its values at least
// min_abs from 0. before_forward runs before every forward (dropout fixes its mask).
void check_layer(
    Bound& b, const Shape& in_sample, std::int64_t B, bool training, float min_abs,
    const std::function<void()>& before_forward = [] {}) {
  Shape in_shape = {B};
  in_shape.insert(in_shape.end(), in_sample.begin(), in_sample.end());
  Tensor x = make_tensor(in_shape, random_values(shape_numel(in_shape), 11, -1.0f, 1.0f, min_abs));
  test::GradCheck o;
  o.training = training;
  o.before_forward = before_forward;
  test::check_layer_gradients(*b.layer, x, b.params, b.grads, b.n, o);
}

// Batch norm's per-channel sums, NCHW and NHWC, with few rows of partial sums per
// channel (added directly) and many (added in stretches first: NHWC's row per run
// of pixels of a batch of large images; a plane whose last run is not whole loads
// of pixels; columns long enough for two levels of stretches): the sums of x and x^2 against the host's,
// `then` given the same, and a second run equal bit for bit.
TEST(Planes, ChannelSumsDirectAndInStretches) {
  struct Case {
    Layout layout;
    std::int64_t B, C, hw;
  };
  for (const Case k :
       {Case{Layout::nhwc, 2, 3, 64}, Case{Layout::nhwc, 4, 5, 1600}, Case{Layout::nhwc, 3, 4, 45},
        Case{Layout::nhwc, 70, 3, 1000}, Case{Layout::nchw, 8, 3, 49}, Case{Layout::nchw, 100, 3, 7},
        Case{Layout::nchw, 2100, 2, 3}}) {
    const std::int64_t rows = partial_rows(k.layout, k.B, k.hw);
    SCOPED_TRACE(std::string(k.layout == Layout::nhwc ? "nhwc" : "nchw") + ", " + std::to_string(rows) +
                 " rows a channel, " + std::to_string(stretch_levels_rows(rows)) + " in stretches");
    const std::vector<float> v = random_values(k.B * k.C * k.hw, 7);
    Tensor x = make_tensor({k.B, k.C, k.hw}, v);
    std::vector<double> want(2 * k.C, 0.0);
    for (std::int64_t b = 0; b < k.B; ++b)
      for (std::int64_t c = 0; c < k.C; ++c)
        for (std::int64_t i = 0; i < k.hw; ++i) {
          const double e = v[k.layout == Layout::nhwc ? (b * k.hw + i) * k.C + c : (b * k.C + c) * k.hw + i];
          want[c] += e;
          want[k.C + c] += e * e;
        }
    const std::vector<double> got = planes_check::sums_and_seen(x.data, k.layout, k.B, k.C, k.hw);
    for (std::int64_t j = 0; j < 2 * k.C; ++j) {
      EXPECT_NEAR(got[j], want[j], 1e-12 * std::abs(want[j]) + 1e-12) << "sum " << j;
      EXPECT_EQ(got[2 * k.C + j], got[j]) << "then's sum " << j;
    }
    EXPECT_EQ(planes_check::sums_and_seen(x.data, k.layout, k.B, k.C, k.hw), got);
  }
  EXPECT_EQ(stretches(64), 0);  // added directly
  // ResNet-50's batch norms after its first convolution, in NHWC at batch 256: 100,352
  // rows, then 3,136, 98 and 4 (added directly); after the next ones 25,088, 784, 25
  EXPECT_EQ(stretches(100352), 3136);
  EXPECT_EQ(stretches(3136), 98);
  EXPECT_EQ(stretches(98), 4);
  EXPECT_EQ(stretches(4), 0);
  EXPECT_EQ(stretch_levels_rows(100352), 3136 + 98 + 4);
  EXPECT_EQ(stretch_levels_rows(25088), 784 + 25);
}

// rows_range (model/tensor.hpp): every element of (rows, columns) and of (a, rows,
// columns) visited once, at its own indices, with columns past a tile and shapes that
// no tile divides (ViT-B/16's d 768 and T 196 among them). On the GPU its tiles are
// its own: a tile the block cannot hold leaves columns out, silently.
TEST(RowsRange, EveryElementOnceAtItsIndices) {
  for (const std::vector<std::int64_t>& s : {std::vector<std::int64_t>{0, 3, 1000},
                                             {0, 196, 768},
                                             {0, 1, 1},
                                             {2, 5, 700},
                                             {3, 196, 768},
                                             {4, 768, 196}})
    EXPECT_EQ(ddp::rows_range_check::rows_range_misses(s[0], s[1], s[2]), 0)
        << s[0] << " x " << s[1] << " x " << s[2];
}

// column_sums (layer norm's and attention's parameter gradients): every column the
// chain the GPU's thread per (stretch, column) adds, stretch by stretch from 0.0 in
// the order of the rows, then the stretches in order, rounded to float once; bit for
// bit, the stretches' double sums too, on the host's row-by-row loops as on the
// device, written or added. The values span 2^-30 to 2^30, so that the double sums
// round and another order of the rows gives other bits.
TEST(ColumnSums, EachColumnIsItsStretchesInOrderBitForBit) {
  for (const auto& [rows, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 5}, {37, 3}, {1000, 67}, {1088, 64}, {4096, 192}}) {
    std::vector<float> v = random_values(rows * n, 11);
    const std::vector<float> e = random_values(rows * n, 13, -30.0f, 30.0f), init = random_values(2 * n, 12);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(e[i]));
    const std::int64_t R = stretch_rows(rows), K = (rows + R - 1) / R;
    EXPECT_EQ(R, static_cast<std::int64_t>(std::ceil(std::sqrt(double(rows)))));
    for (const int terms : {1, 2})
      for (const bool add : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(n) + ", " + std::to_string(terms) +
                     " term(s)" + (add ? ", added" : ""));
        std::vector<float> want(terms * n);
        std::vector<double> want_partial(terms * K * n);
        for (int m = 0; m < terms; ++m)
          for (std::int64_t j = 0; j < n; ++j) {
            double total = 0.0;
            for (std::int64_t k = 0; k < K; ++k) {
              double s = 0.0;
              for (std::int64_t r = k * R; r < std::min(k * R + R, rows); ++r) {
                const float a = v[r * n + j], b = a * 1.5f;
                s += terms == 2 && m == 0 ? double(a) * b : double(a);
              }
              want_partial[(m * K + k) * n + j] = s;
              total += s;
            }
            const float o = init[m * n + j];
            want[m * n + j] = add ? o + static_cast<float>(total) : static_cast<float>(total);
          }
        const column_sums_check::Result got = column_sums_check::run(v, rows, n, terms, init, add);
        for (std::size_t i = 0; i < want_partial.size(); ++i)
          ASSERT_EQ(got.partial[i], want_partial[i]) << "stretch sum " << i;
        for (std::int64_t i = 0; i < terms * n; ++i) ASSERT_EQ(got.out[i], want[i]) << "result " << i;
      }
  }
}

TEST(Linear, ForwardIsXWtPlusB) {
  Bound b(std::make_unique<Linear>(2), {3});
  test::from_host(b.params, {1, 2, 3, 4, 5, 6, 0.5f, -1});  // W (2, 3), b (2)
  Tensor x = make_tensor({2, 3}, {1, 0, -1, 2, 1, 0}), y;
  b.layer->forward(x, y, false);
  EXPECT_EQ(y.shape, (Shape{2, 2}));
  EXPECT_EQ(to_host(y.data, 4), (std::vector<float>{-1.5f, -3, 4.5f, 12}));
}

TEST(Linear, GradientCheck) {
  Bound b(std::make_unique<Linear>(4), {5});
  check_layer(b, {5}, 3, true, 0.0f);
}

TEST(Linear, GradientsAccumulate) {
  Bound b(std::make_unique<Linear>(3), {4});
  Tensor x = make_tensor({2, 4}, random_values(8, 1)), y, dx;
  b.layer->forward(x, y, true);
  Tensor dy = make_tensor({2, 3}, random_values(6, 2));
  b.layer->backward(x, y, dy, dx);
  std::vector<float> once = to_host(b.grads, b.n);
  b.layer->backward(x, y, dy, dx);
  std::vector<float> twice = to_host(b.grads, b.n);
  for (std::int64_t i = 0; i < b.n; ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]) << i;
}

TEST(Linear, RejectsNonFlatInput) {
  Linear l(10);
  try {
    l.output_shape({1, 28, 28});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "linear needs a flat input (features) but gets (1, 28, 28): add 'flatten' before it");
  }
}

TEST(ReLU, GradientCheck) {
  Bound b(std::make_unique<ReLU>(), {2, 3});
  check_layer(b, {2, 3}, 4, true, 0.1f);  // |x| >= 0.1 > eps: no kink crossed
}

// As PyTorch 1.13: relu([nan, -1, 2, 0]) = [nan, 0, 2, 0], and its gradient passes
// where the output is NaN: [1, 0, 1, 0].
TEST(ReLU, KeepsNaNAsPyTorch) {
  ReLU relu;
  relu.output_shape({4});
  Tensor x = make_tensor({1, 4}, {NAN, -1.0f, 2.0f, 0.0f}), y, dy = make_tensor({1, 4}, {1, 1, 1, 1}), dx;
  relu.forward(x, y, true);
  const std::vector<float> yh = to_host(y.data, 4);
  EXPECT_TRUE(std::isnan(yh[0]));
  EXPECT_EQ(yh[1], 0.0f);
  EXPECT_EQ(yh[2], 2.0f);
  EXPECT_EQ(yh[3], 0.0f);
  relu.backward(x, y, dy, dx);
  EXPECT_EQ(to_host(dx.data, 4), (std::vector<float>{1, 0, 1, 0}));
}

TEST(Tanh, GradientCheck) {
  Bound b(std::make_unique<Tanh>(), {7});
  check_layer(b, {7}, 3, true, 0.0f);
}

// exp_fast (GELU's and attention's softmax's exp), computed in a kernel: within 1.5
// ulp of exp (in double) over a sweep of the floats whose exp is normal; subnormal
// results within one subnormal step; 1 at 0; 0, inf and NaN where expf gives them. On
// the device (the GPU build) exp_fast is CUDA's expf, documented within 2 ulp: 2 ulp
// and 2 subnormal steps there.
TEST(ExpFast, WithinOneAndAHalfUlpOfExp) {
  std::vector<float> xs;
  for (std::uint32_t u = 0; u <= float_bits(88.7f); u += 1021) xs.push_back(bits_float(u));
  for (std::uint32_t u = 0x80000000u; u <= float_bits(-87.3f); u += 1021) xs.push_back(bits_float(u));
  const std::vector<float> edges = {0.0f,   -0.0f,   1.0f,    -1.0f,   88.72f,   89.0f,    100.0f,    -88.0f,
                                    -95.0f, -103.0f, -104.0f, -150.0f, -1000.0f, INFINITY, -INFINITY, NAN};
  xs.insert(xs.end(), edges.begin(), edges.end());
  const std::int64_t n = static_cast<std::int64_t>(xs.size());
  const std::vector<float> y = exp_fast_check::on_device(xs);
  const bool device = compute_backend().device_memory();
  double worst = 0.0;
  float worst_x = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = xs[i];
    const double e = std::exp(static_cast<double>(x));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (e > 3.4028234663852886e38) {  // past FLT_MAX
      EXPECT_EQ(y[i], INFINITY) << "x = " << x;
    } else if (e < 1.1754943508222875e-38) {  // a subnormal result, or 0
      EXPECT_LE(std::fabs(y[i] - e), device ? 3e-45 : 1.5e-45) << "x = " << x;
    } else {
      const double rel = std::fabs(y[i] - e) / e;
      if (rel > worst) worst = rel, worst_x = x;
    }
  }
  EXPECT_LE(worst, (device ? 2.0 : 1.5) * std::ldexp(1.0, -23)) << "at x = " << worst_x;  // ulps of [1, 2)
  EXPECT_EQ(y[n - edges.size()], 1.0f);                                                   // exp(0)
  EXPECT_EQ(y[n - edges.size() + 1], 1.0f);                                               // exp(-0)
}

// normal_cdf (the exact GELU's Phi), computed in a kernel, against 0.5 erfc(-x / sqrt 2)
// in double, over a sweep of the floats wherever Phi is a normal float (x from -13
// up), the lower tail included, where 1 + erf loses its digits: relative error at most
// (8 + 2 z^2) ulp of [1, 2), z = x / sqrt 2. The z^2 is the conditioning of exp(-z^2)
// in float: z and its square round to 2^-24 of themselves, and an error e in exp's
// argument is e of its result (x = -11.3: 85 to 112 ulp, Phi = 7e-30). For |x| < 2
// (most of a GELU's inputs) that is under 12 ulp. 0 and 1 at the infinities, 0.5 at
// 0, NaN for NaN. On the device it is CUDA's erfcf (within 4 ulp of erfc), held to
// the same bound.
TEST(NormalCdf, WithinItsConditioningOfPhiEverywhereNormal) {
  std::vector<float> xs;
  for (std::uint32_t u = 0; u <= float_bits(13.0f); u += 997) xs.push_back(bits_float(u));
  for (std::uint32_t u = 0x80000000u; u <= float_bits(-13.0f); u += 997) xs.push_back(bits_float(u));
  const std::vector<float> edges = {0.0f, INFINITY, -INFINITY, NAN};
  xs.insert(xs.end(), edges.begin(), edges.end());
  const std::int64_t n = static_cast<std::int64_t>(xs.size()),
                     e0 = n - static_cast<std::int64_t>(edges.size());
  const std::vector<float> y = exp_fast_check::on_device(xs, /*cdf=*/true);
  const double ulp = std::ldexp(1.0, -23);
  double worst = 0.0;  // relative error / its bound
  float worst_x = 0.0f;
  for (std::int64_t i = 0; i < e0; ++i) {
    const double x = xs[i], phi = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double ratio = std::fabs(y[i] - phi) / phi / ((8.0 + x * x) * ulp);  // 2 z^2 = x^2
    if (ratio > worst) worst = ratio, worst_x = xs[i];
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_x;
  std::printf("normal_cdf: worst relative error %.2f of its bound, at x = %g, over %lld points\n", worst,
              double(worst_x), static_cast<long long>(e0));
  EXPECT_EQ(y[e0], 0.5f);
  EXPECT_EQ(y[e0 + 1], 1.0f);
  EXPECT_EQ(y[e0 + 2], 0.0f);
  EXPECT_TRUE(std::isnan(y[e0 + 3]));
}

TEST(Flatten, ReshapesWithoutCopy) {
  Flatten f;
  EXPECT_EQ(f.output_shape({2, 3, 4}), (Shape{24}));
  Tensor x = make_tensor({5, 2, 3, 4}, random_values(120, 3)), y;
  f.forward(x, y, true);
  EXPECT_EQ(y.shape, (Shape{5, 24}));
  EXPECT_EQ(y.data.data(), x.data.data());
}

TEST(Flatten, GradientCheck) {
  Bound b(std::make_unique<Flatten>(), {2, 3});
  check_layer(b, {2, 3}, 2, true, 0.0f);
}

TEST(Dropout, GradientCheckWithFixedMask) {
  Bound b(std::make_unique<Dropout>(0.4f), {10});
  check_layer(b, {10}, 3, true, 0.0f, [&] { b.layer->reseed(42); });
}

TEST(Dropout, DropsAFractionPAndScalesTheRest) {
  const float p = 0.3f;
  Dropout d(p);
  d.output_shape({1000});
  d.reseed(5);
  std::vector<float> xv = random_values(100000, 4, 0.5f, 1.0f);
  Tensor x = make_tensor({100, 1000}, xv), y;
  d.forward(x, y, true);
  std::vector<float> first = to_host(y.data, y.numel());
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (first[i] == 0.0f)
      ++dropped;
    else
      EXPECT_FLOAT_EQ(first[i], xv[i] / (1 - p)) << i;
  }
  EXPECT_NEAR(double(dropped) / xv.size(), p, 0.01);

  d.forward(x, y, true);  // the stream moves on: a new mask
  EXPECT_NE(to_host(y.data, y.numel()), first);
  d.reseed(5);  // and restarts reproducibly
  d.forward(x, y, true);
  EXPECT_EQ(to_host(y.data, y.numel()), first);
  d.reseed(6);
  d.forward(x, y, true);
  EXPECT_NE(to_host(y.data, y.numel()), first);
}

TEST(Dropout, EvalIsIdentity) {
  Dropout d(0.5f);
  d.output_shape({4});
  Tensor x = make_tensor({2, 4}, random_values(8, 5)), y, dx;
  d.forward(x, y, false);
  EXPECT_EQ(y.shape, x.shape);
  EXPECT_EQ(to_host(y.data, 8), to_host(x.data, 8));
  Tensor dy = make_tensor({2, 4}, random_values(8, 6));
  d.backward(x, y, dy, dx);
  EXPECT_EQ(to_host(dx.data, 8), to_host(dy.data, 8));
}

TEST(Registry, BuildsEachKind) {
  EXPECT_EQ(make_layer("linear(3)")->kind(), "linear");
  EXPECT_EQ(make_layer(" ReLU ")->kind(), "relu");
  EXPECT_EQ(make_layer("TANH")->kind(), "tanh");
  EXPECT_EQ(make_layer("Flatten")->kind(), "flatten");
  EXPECT_EQ(make_layer("dropout( 0.5 )")->kind(), "dropout");
  EXPECT_EQ(make_layer("dropout(0)")->kind(), "dropout");
  EXPECT_EQ(make_layer("patch_embed(16, 768)")->kind(), "patch_embed");
  EXPECT_EQ(make_layer("class_token")->kind(), "class_token");
  EXPECT_EQ(make_layer("token_pool(mean)")->kind(), "token_pool");
  EXPECT_EQ(make_layer("linear(50304, bias=false, tied)")->kind(), "linear");
  EXPECT_EQ(known_layers().substr(0, 66),
            "linear(n[, bias=false][, tied]), relu, tanh, flatten, dropout(p), ");  // then the CNN layers
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

using test::make_tensor;
using test::random_values;

using test::allocated_since;
using test::live_blocks;
using test::RecordAllocations;

// What a layer allocates in a training forward and backward, beyond its output and
// input gradient, from fresh shared slots, against what it plans (Layer::kept_floats
// and scratch_floats, the start-up memory line's): the same floats, with the host's
// buffers unskewed (set_buffer_skew: as a GPU's, no page start added), but for the
// small sums the plan leaves out (the bias, layer norm and batch norm gradients'
// partial sums) and Kokkos's own (its teams' scratch). Less would make the GPU
// build refuse runs that fit; more, pass runs that do not. Each path of attention
// (keep, blocks, fused where the backend has it), without the input gradient too, at
// fp32 and bf16 (the GPU build's narrow copies); the residual blocks unfused in NCHW
// (the model's fused, blocked and narrow ones: the next test).
TEST(MemoryPlan, LayersAllocateWhatTheyPlan) {
  struct Case {
    const char* spec;
    Shape in;
    bool input_grad;
  };
  const Case cases[] = {{"attention(4, causal, block=0)", {128, 64}, true},
                        {"attention(4, block=32)", {128, 64}, true},
                        {"attention(4, causal, fused)", {128, 64}, true},
                        {"attention(4, block=0)", {128, 64}, false},
                        {"transformer_block(4, causal)", {128, 64}, true},
                        {"transformer_block(4, causal, fused)", {128, 64}, true},
                        {"layernorm", {128, 64}, true},
                        {"gelu", {128, 64}, true},
                        {"linear(96)", {128, 64}, true},
                        {"linear(96)", {128, 64}, false},
                        {"dropout(0.1)", {128, 64}, true},
                        {"maxpool(2)", {8, 32, 32}, true},
                        {"patch_embed(4, 32)", {3, 32, 32}, true},
                        {"conv2d(8, 3, pad=1)", {3, 16, 16}, true},
                        {"resblock(16)", {16, 8, 8}, true},
                        {"resblock(16)", {16, 8, 8}, false},
                        {"resblock(32, stride=2)", {16, 8, 8}, true},
                        {"bottleneck(4)", {16, 8, 8}, true},
                        {"bottleneck(8, stride=2)", {16, 8, 8}, true},
                        {"bottleneck(8, stride=2)", {16, 8, 8}, false}};
  const RecordAllocations recording;
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (const Case& c : cases) {
      const std::int64_t B = 4;
      release_shared_scratch();
      std::unique_ptr<Layer> layer = make_layer(c.spec);
      const Shape out = layer->output_shape(c.in);
      layer->set_precision(p);
      layer->set_needs_input_grad(c.input_grad);
      std::int64_t n = 0;
      for (const auto& s : layer->parameter_specs()) n += shape_numel(s.shape);
      View1 params("test::params", std::max<std::int64_t>(n, 1)),
          grads("test::grads", std::max<std::int64_t>(n, 1));
      layer->bind(params.data(), grads.data());
      std::int64_t nb = 0;
      for (const auto& s : layer->buffer_specs()) nb += shape_numel(s.shape);
      View1 buffers("test::buffers", std::max<std::int64_t>(nb, 1));
      layer->bind_buffers(buffers.data());
      Rng rng(1);
      layer->init(rng);
      Shape xs = {B}, ys = {B};
      xs.insert(xs.end(), c.in.begin(), c.in.end());
      ys.insert(ys.end(), out.begin(), out.end());
      Tensor x = make_tensor(xs, random_values(shape_numel(xs), 1)), y,
             dy = make_tensor(ys, random_values(shape_numel(ys), 2)), dx;
      const auto before = live_blocks();
      layer->forward(x, y, true);
      layer->backward(x, y, dy, dx);
      Kokkos::fence();
      std::int64_t blocks = 0, floats = allocated_since(before, &blocks);
      floats -= y.numel() + dx.numel();  // the model plans these
      SlotFloats slots{};
      layer->scratch_floats(B, slots);
      std::int64_t planned = layer->kept_floats(B);
      for (std::int64_t s : slots) planned += s;
      std::cout << "  " << c.spec << (c.input_grad ? "" : " (no dx)") << " " << precision_name(p)
                << ": planned " << planned << " floats, allocated " << floats << " in " << blocks
                << " blocks\n";
      EXPECT_EQ(floats, planned) << c.spec << " " << precision_name(p);
    }
}

// A whole model's plan (Model::activation_floats: outputs, the gradients between
// layers, what layers keep, each shared slot once at the largest any layer asks; no
// buffer for a relu fused into its linear, flatten, nor the first trained layer's
// input gradient) against what a training forward and backward allocate from fresh
// slots: the same floats, as above. A transformer with a fused relu, flatten and dropout (at bf16 with its
// blocks' inner activations narrow too); ResNets with the
// model's blocked layouts (their padding channels: the stem's 3 and 8 of the second), its fused passes or
// not, and at bf16 with narrow activations, which the host's convolutions take as fp32 copies (the GPU's
// narrow path, widened); a residual block reordering its x and y at its edges (an average pool before it,
// flatten after).
TEST(MemoryPlan, AModelAllocatesWhatItPlans) {
  struct Case {
    std::vector<std::string> layers;
    Shape in;
    bool fuse, narrow;
  };
  const std::vector<std::string> resnet = {
      "conv2d(16, 3, pad=1, bias=false)", "batchnorm2d",  "relu",          "maxpool(2)", "resblock(16)",
      "bottleneck(8, stride=2)",          "resblock(32)", "globalavgpool", "flatten",    "linear(10)"};
  const std::vector<std::string> edges = {"conv2d(8, 3, pad=1)",    "relu",    "avgpool(2)", "resblock(8)",
                                          "resblock(24, stride=2)", "flatten", "linear(10)"};
  const std::vector<std::string> transformer = {"linear(64)",
                                                "relu",
                                                "transformer_block(4, causal)",
                                                "transformer_block(4, causal, block=16)",
                                                "layernorm",
                                                "flatten",
                                                "dropout(0.1)",
                                                "linear(10)"};
  const Case cases[] = {{transformer, {128, 32}, true, false}, {transformer, {128, 32}, true, true},
                        {resnet, {3, 16, 16}, true, false},    {resnet, {3, 16, 16}, false, false},
                        {resnet, {3, 16, 16}, true, true},     {edges, {3, 16, 16}, true, false},
                        {edges, {3, 16, 16}, true, true}};
  const RecordAllocations recording;
  for (const Case& c : cases)
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      if (c.narrow && p == Precision::fp32) continue;
      const std::string name = c.layers[1] + "..." + (c.fuse ? "" : " unfused") +
                               (c.narrow ? " narrow" : "") + " " + precision_name(p);
      const std::int64_t B = 4;
      release_shared_scratch();
      Model m(c.layers, c.in, 1, c.fuse);
      m.set_precision(p);
      m.plan_narrow_activations(c.narrow);
      Shape xs = {B};
      xs.insert(xs.end(), c.in.begin(), c.in.end());
      Tensor x = make_tensor(xs, random_values(shape_numel(xs), 3)),
             dout = make_tensor({B, 10}, random_values(B * 10, 4));
      const auto before = live_blocks();
      m.forward(x, true);
      m.backward(dout);
      Kokkos::fence();
      std::int64_t blocks = 0;
      const std::int64_t floats = allocated_since(before, &blocks);
      const std::int64_t planned = m.activation_floats(B);
      std::cout << "  " << name << ": planned " << planned << " floats, allocated " << floats << " in "
                << blocks << " blocks\n";
      EXPECT_EQ(floats, planned) << name;
    }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// The bytes malloc hands out now: glibc's, in its heap and in its own mappings, or
// AddressSanitizer's, whose malloc replaces glibc's in the sanitizer build.
std::int64_t malloc_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return std::int64_t(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 m = mallinfo2();
  return std::int64_t(m.uordblks + m.hblkhd);
#endif
}

// What the convolution library holds for a model's calls (Model::library_bytes:
// oneDNN's copies of operands in its layouts and types, its scratchpads, the weight
// gradients' buffer) against what malloc gives out for a fresh model, built and
// through a training forward and backward, besides Kokkos's buffers: never less, and
// within 5% and 256 KB (the layers, the primitives themselves, their argument maps). Each model runs after a
// twin, whose primitives leave their JIT code in oneDNN's primitive cache (held
// once a shape for the process; not planned). fp32, bf16 (oneDNN's own kernels where
// the CPU has them, emulated elsewhere), fp16 (emulated: every input copied and
// rounded).
TEST(MemoryPlan, TheConvolutionLibraryHoldsWhatItPlans) {
  if (compute_backend().name().find("oneDNN") == std::string::npos) GTEST_SKIP() << "no host library here";
  const RecordAllocations recording;
  const std::int64_t B = 8;
  const std::vector<std::string> layers = {"conv2d(16, 3, pad=1, bias=false)",
                                           "batchnorm2d",
                                           "relu",
                                           "resblock(16)",
                                           "bottleneck(16, stride=2)",
                                           "conv2d(32, 3, pad=1)",
                                           "relu",
                                           "flatten",
                                           "linear(10)"};
  const Tensor x = make_tensor({B, 3, 32, 32}, random_values(B * 3 * 32 * 32, 3)),
               dout = make_tensor({B, 10}, random_values(B * 10, 4));
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    for (int twin = 0; twin < 2; ++twin) {
      release_shared_scratch();
      const auto before = live_blocks();
      const std::int64_t in_use = malloc_in_use();
      Model m(layers, {3, 32, 32}, 1);
      m.set_precision(p);
      m.forward(x, true);
      m.backward(dout);
      Kokkos::fence();
      if (twin == 0) continue;
      std::int64_t ours = 0;  // every Kokkos block, the small sums and its own too
      for (const auto& [ptr, block] : live_blocks())
        if (!before.count(ptr)) ours += std::int64_t(block.first);
      const std::int64_t library = malloc_in_use() - in_use - ours, planned = m.library_bytes(B);
      std::cout << "  " << precision_name(p) << ": library planned " << planned << " B, allocated " << library
                << " B\n";
      EXPECT_GE(library, planned) << precision_name(p);
      EXPECT_LE(library, planned + planned / 20 + 256 * 1024) << precision_name(p);
    }
  }
}

// oneDNN's primitives and their copies are kept for two batch sizes at most (the
// largest and the last other, onednn_conv.cpp): after a step at 8, a validation
// forward at 3 and a step at 5 (an epoch's short last batch), malloc holds the set
// of 5 beyond the set of 8 (within 10%: the weight gradients' buffer, planned in
// it, came with the set of 8), not half of that of 3 besides; and the step
// at 5 gives the bits a fresh model's gives.
TEST(MemoryPlan, TheConvolutionLibraryKeepsTwoBatchSizes) {
  if (compute_backend().name().find("oneDNN") == std::string::npos) GTEST_SKIP() << "no host library here";
  const std::vector<std::string> layers = {"conv2d(16, 3, pad=1, bias=false)",
                                           "batchnorm2d",
                                           "relu",
                                           "resblock(16)",
                                           "globalavgpool",
                                           "flatten",
                                           "linear(10)"};
  const Shape sample = {3, 32, 32};
  auto input = [&](std::int64_t B, std::uint64_t seed) {
    return make_tensor({B, 3, 32, 32}, random_values(B * 3 * 32 * 32, seed));
  };
  auto step = [&](Model& m, std::int64_t B) {
    m.forward(input(B, 5), true);
    m.zero_grad();
    m.backward(make_tensor({B, 10}, random_values(B * 10, 6)));
    Kokkos::fence();
  };
  Model fresh(layers, sample, 1);
  step(fresh, 5);
  const std::vector<float> want = to_host(fresh.gradients(), fresh.num_parameters());
  for (std::int64_t B : {8, 3}) {  // their primitives' JIT code into oneDNN's cache first
    Model twin(layers, sample, 1);
    B == 8 ? step(twin, B) : (void)twin.forward(input(B, 7), false);
  }
  Model m(layers, sample, 1);
  step(m, 8);
  const std::int64_t in_use = malloc_in_use();
  m.forward(input(3, 7), false);
  step(m, 5);
  const std::int64_t grown = malloc_in_use() - in_use, five = m.library_bytes(5), three = m.library_bytes(3);
  std::cout << "  after batch 8: a set for 5 planned " << five << " B (for 3: " << three << " B), grown "
            << grown << " B\n";
  EXPECT_GT(grown, five - five / 10);
  EXPECT_LT(grown, five + three / 2);
  EXPECT_EQ(to_host(m.gradients(), m.num_parameters()), want);
}

}  // namespace
}  // namespace ddp
