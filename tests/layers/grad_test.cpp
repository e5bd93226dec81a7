// The CNN and transformer layers against central finite differences of
// L = sum(w * y), for the input and for every parameter; their shapes, specs and error
// messages.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>

#include "comm/check.hpp"
#include "layer_fixture.hpp"
#include "model/attention.hpp"
#include "model/gelu.hpp"
#include "model/model.hpp"
#include "model/transformer_block.hpp"

namespace ddp {
namespace {

using test::BoundLayer;
using test::make_tensor;
using test::random_values;
using test::to_host;

// Values spread at least `gap` apart in a random order: a max-pool window then has
// one clear maximum, and a finite-difference step never changes which one.
std::vector<float> distinct_values(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(n);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

struct CheckOptions {
  bool training = true;
  bool distinct = false;  // inputs from distinct_values
  double eps = 1e-2, rtol = 1e-2, atol = 1e-3;
};
const CheckOptions kDistinct{true, true}, kEval{false, false};

void grad_check(BoundLayer& b, std::int64_t B, CheckOptions o = {}) {
  const Shape in_shape = b.batch_shape(B, b.in_sample);
  const std::int64_t nx = shape_numel(in_shape);
  Tensor x = make_tensor(in_shape, o.distinct ? distinct_values(nx, 11) : random_values(nx, 11));
  Tensor y;
  b.layer->forward(x, y, o.training);
  ASSERT_EQ(y.shape, b.batch_shape(B, b.out_sample));
  test::GradCheck g;
  g.training = o.training;
  g.eps = o.eps, g.rtol = o.rtol, g.atol = o.atol;
  test::check_layer_gradients(*b.layer, x, b.params, b.grads, b.n, g);
}

TEST(Conv2d, ShapesAndParameters) {
  BoundLayer b("conv2d(8, 3, stride=2, pad=1)", {3, 9, 7});
  EXPECT_EQ(b.out_sample, (Shape{8, 5, 4}));
  ASSERT_EQ(b.layer->parameter_specs().size(), 2u);
  EXPECT_EQ(b.layer->parameter_specs()[0].suffix, "weight");
  EXPECT_EQ(b.layer->parameter_specs()[0].shape, (Shape{8, 3, 3, 3}));
  EXPECT_EQ(b.layer->parameter_specs()[1].shape, (Shape{8}));
  BoundLayer nb("conv2d(4, 1, bias=false)", {2, 5, 5});
  EXPECT_EQ(nb.layer->parameter_specs().size(), 1u);
  EXPECT_EQ(nb.out_sample, (Shape{4, 5, 5}));
  // PyTorch's init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 3*3*3
  for (float v : to_host(b.params, b.n)) EXPECT_LE(std::fabs(v), 1.0f / std::sqrt(27.0f));
}

TEST(Conv2d, ForwardOfAKnownKernel) {
  // 1 -> 1 channel, 2x2 kernel of ones, bias 0.5, on a 3x3 input 1..9 with no padding
  BoundLayer b("conv2d(1, 2)", {1, 3, 3});
  test::from_host(b.params, {1, 1, 1, 1, 0.5f});
  Tensor x = make_tensor({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), y;
  b.layer->forward(x, y, false);
  EXPECT_EQ(to_host(y.data, 4), (std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f}));
}

TEST(Conv2d, GradientCheckStridePad) {
  BoundLayer b("conv2d(4, 3, stride=2, pad=1)", {3, 7, 6});
  grad_check(b, 2);
}

TEST(Conv2d, GradientCheckNoPadNoBias) {
  BoundLayer b("conv2d(3, 2, bias=false)", {2, 5, 5});
  grad_check(b, 3);
}

// Enough channels for oneDNN's channel-blocked kernels (nChw8c with AVX2, nChw16c
// with AVX-512): reorders in and out, and backward data reading backward weights'
// copy of dy.
TEST(Conv2d, GradientCheckBlockedLayout) {
  BoundLayer b("conv2d(32, 3, pad=1)", {16, 5, 5});
  grad_check(b, 2);
}

TEST(Conv2d, GradientsAccumulateAndBatchSizesShareNothing) {
  BoundLayer b("conv2d(2, 3, pad=1)", {1, 4, 4});
  Tensor x = make_tensor({2, 1, 4, 4}, random_values(32, 3)), y, dx;
  b.layer->forward(x, y, true);
  Tensor dy = make_tensor(y.shape, random_values(y.numel(), 4));
  b.layer->backward(x, y, dy, dx);
  std::vector<float> once = to_host(b.grads, b.n);
  // A different batch size in between gets its own primitives.
  Tensor x1 = make_tensor({1, 1, 4, 4}, random_values(16, 5)), y1;
  b.layer->forward(x1, y1, true);
  b.layer->forward(x, y, true);
  b.layer->backward(x, y, dy, dx);
  std::vector<float> twice = to_host(b.grads, b.n);
  for (std::int64_t i = 0; i < b.n; ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-5f);
}

TEST(MaxPool, ForwardPicksTheMaximum) {
  BoundLayer b("maxpool(2)", {1, 2, 4});
  Tensor x = make_tensor({1, 1, 2, 4}, {1, 5, 2, 0, 3, -1, 7, 8}), y;
  b.layer->forward(x, y, false);
  EXPECT_EQ(y.shape, (Shape{1, 1, 1, 2}));
  EXPECT_EQ(to_host(y.data, 2), (std::vector<float>{5, 8}));
}

TEST(MaxPool, GradientCheck) {
  BoundLayer b("maxpool(2)", {3, 6, 5});  // odd width: the last column is dropped
  EXPECT_EQ(b.out_sample, (Shape{3, 3, 2}));
  grad_check(b, 2, kDistinct);
}

TEST(MaxPool, GradientCheckOverlappingWindows) {
  BoundLayer b("maxpool(3, stride=2)", {2, 7, 7});
  EXPECT_EQ(b.out_sample, (Shape{2, 3, 3}));
  grad_check(b, 2, kDistinct);
}

// ResNet's stem pool, nn.MaxPool2d(3, stride=2, padding=1): the padding never wins,
// even over inputs that are all negative, and every window has real elements.
TEST(MaxPool, PaddedWindows) {
  BoundLayer b("maxpool(3, stride=2, pad=1)", {2, 7, 6});
  EXPECT_EQ(b.out_sample, (Shape{2, 4, 3}));
  grad_check(b, 2, kDistinct);
  BoundLayer s("maxpool(3, stride=2, pad=1)", {1, 2, 2});
  Tensor x = make_tensor({1, 1, 2, 2}, {-4, -3, -2, -5}), y;
  s.layer->forward(x, y, false);
  EXPECT_EQ(to_host(y.data, 1), (std::vector<float>{-2}));
  // Non-overlapping padded windows take the banded backward.
  BoundLayer n("maxpool(2, stride=2, pad=1)", {2, 5, 4});
  EXPECT_EQ(n.out_sample, (Shape{2, 3, 3}));
  grad_check(n, 2, kDistinct);
}

TEST(AvgPool, PaddedWindowsCountThePadding) {
  BoundLayer b("avgpool(3, stride=2, pad=1)", {1, 3, 3});
  Tensor x = make_tensor({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), y;
  b.layer->forward(x, y, false);
  // The top-left window holds 1, 2, 4, 5 and five zeros of padding: 12 / 9.
  EXPECT_EQ(to_host(y.data, 4), (std::vector<float>{12.0f / 9, 16.0f / 9, 24.0f / 9, 28.0f / 9}));
  BoundLayer g("avgpool(3, stride=2, pad=1)", {2, 6, 5});
  grad_check(g, 2);
}

// Backward writes every element of dx, also those outside every window (an odd
// last row and column, the gaps of stride > k), whatever the buffer held before.
TEST(MaxPool, BackwardOverwritesTheWholeGradient) {
  const std::pair<const char*, std::int64_t> cases[] = {{"maxpool(2)", 2}, {"maxpool(2, stride=3)", 3}};
  for (const auto& [spec, s] : cases) {
    BoundLayer b(spec, {2, 7, 5});
    const std::int64_t H = 7, W = 5, Ho = b.out_sample[1], Wo = b.out_sample[2];
    Tensor x = make_tensor(b.batch_shape(2, b.in_sample), random_values(2 * 2 * H * W, 21)), y;
    b.layer->forward(x, y, true);
    Tensor dy = make_tensor(y.shape, random_values(y.numel(), 22));
    Tensor dx = make_tensor(x.shape, std::vector<float>(x.numel(), 7.0f));
    b.layer->backward(x, y, dy, dx);
    const std::vector<float> xh = to_host(x.data, x.numel()), dyh = to_host(dy.data, dy.numel());
    std::vector<float> want(x.numel(), 0.0f);
    for (std::int64_t p = 0; p < 4; ++p)
      for (std::int64_t i = 0; i < Ho; ++i)
        for (std::int64_t j = 0; j < Wo; ++j) {
          std::int64_t best = p * H * W + i * s * W + j * s;
          for (std::int64_t di = 0; di < 2; ++di)
            for (std::int64_t dj = 0; dj < 2; ++dj) {
              const std::int64_t at = p * H * W + (i * s + di) * W + j * s + dj;
              if (xh[at] > xh[best]) best = at;
            }
          want[best] += dyh[(p * Ho + i) * Wo + j];
        }
    EXPECT_EQ(to_host(dx.data, dx.numel()), want) << spec;
  }
}

TEST(AvgPool, GradientCheck) {
  BoundLayer b("avgpool(2)", {2, 4, 5});
  grad_check(b, 2);
  BoundLayer o("avgpool(3, stride=2)", {2, 7, 6});
  EXPECT_EQ(o.out_sample, (Shape{2, 3, 2}));
  grad_check(o, 2);
}

TEST(GlobalAvgPool, ShapeAndGradientCheck) {
  BoundLayer b("globalavgpool", {4, 3, 5});
  EXPECT_EQ(b.out_sample, (Shape{4, 1, 1}));
  grad_check(b, 3);
}

TEST(BatchNorm2d, ParametersAndBuffers) {
  BoundLayer b("batchnorm2d", {3, 4, 4});
  ASSERT_EQ(b.layer->parameter_specs().size(), 2u);
  auto bufs = b.layer->buffer_specs();
  ASSERT_EQ(bufs.size(), 3u);
  EXPECT_EQ(bufs[0].suffix, "running_mean");
  EXPECT_EQ(bufs[1].suffix, "running_var");
  EXPECT_EQ(bufs[2].suffix, "num_batches_tracked");
  EXPECT_EQ(bufs[2].shape, Shape{});
  EXPECT_EQ(to_host(b.params, 6), (std::vector<float>{1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(to_host(b.buffers, 7), (std::vector<float>{0, 0, 0, 1, 1, 1, 0}));
}

TEST(BatchNorm2d, TrainingNormalisesEachChannel) {
  BoundLayer b("batchnorm2d", {2, 3, 3});
  Tensor x = make_tensor({4, 2, 3, 3}, random_values(72, 7, -3.0f, 5.0f)), y;
  b.layer->forward(x, y, true);
  std::vector<float> yh = to_host(y.data, 72);
  for (int c = 0; c < 2; ++c) {
    double s = 0, ss = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 9; ++i) {
        double v = yh[(n * 2 + c) * 9 + i];
        s += v;
        ss += v * v;
      }
    EXPECT_NEAR(s / 36, 0.0, 1e-5);
    EXPECT_NEAR(ss / 36, 1.0, 1e-3);  // biased variance, up to eps
  }
  EXPECT_EQ(to_host(b.buffers, 5)[4], 1.0f);  // num_batches_tracked
}

TEST(BatchNorm2d, GradientCheckTraining) {
  BoundLayer b("batchnorm2d", {3, 3, 2});
  test::from_host(b.params, random_values(6, 9, 0.5f, 1.5f));  // gamma, beta away from 1, 0
  grad_check(b, 4);
}

TEST(BatchNorm2d, GradientCheckEval) {
  BoundLayer b("batchnorm2d", {2, 3, 3});
  test::from_host(b.params, random_values(4, 9, 0.5f, 1.5f));
  test::from_host(b.buffers, {0.3f, -0.2f, 1.5f, 0.7f, 0.0f});
  grad_check(b, 2, kEval);
}

// The block's relus have kinks that a finite-difference step can straddle, and one
// relu input that sits within ~1e-4 of zero spoils the differences of every weight
// upstream of it: the input seed is one without such a near-tie, eps is small, and a
// few elements (< 2%) may still miss. torch_compare_test checks every element.
void resblock_check(const std::string& spec, const Shape& in) {
  BoundLayer b(spec, in);
  const Shape in_shape = b.batch_shape(3, in);
  Tensor x = make_tensor(in_shape, random_values(shape_numel(in_shape), 23));
  test::GradCheck g;
  g.eps = 1e-3, g.rtol = 2e-2, g.atol = 3e-3;
  g.w_seed = 22;
  g.max_off = 0.02;
  test::check_layer_gradients(*b.layer, x, b.params, b.grads, b.n, g);
}

TEST(ResBlock, GradientCheckIdentity) { resblock_check("resblock(3)", {3, 5, 5}); }
TEST(ResBlock, GradientCheckProjection) { resblock_check("resblock(4, stride=2)", {2, 6, 5}); }

TEST(ResBlock, NamesFollowBasicBlock) {
  BoundLayer id("resblock(4)", {4, 6, 6});
  std::vector<std::string> names;
  for (const auto& p : id.layer->parameter_specs()) names.push_back(p.suffix);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight",
                                             "bn2.weight", "bn2.bias"}));
  BoundLayer proj("resblock(8, stride=2)", {4, 6, 6});
  EXPECT_EQ(proj.out_sample, (Shape{8, 3, 3}));
  names.clear();
  for (const auto& p : proj.layer->buffer_specs()) names.push_back(p.suffix);
  EXPECT_EQ(names, (std::vector<std::string>{"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                                             "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked",
                                             "downsample.1.running_mean", "downsample.1.running_var",
                                             "downsample.1.num_batches_tracked"}));
  EXPECT_EQ(proj.n, 8 * 4 * 9 + 16 + 8 * 8 * 9 + 16 + 8 * 4 + 16);
}

TEST(Bottleneck, GradientCheckIdentity) { resblock_check("bottleneck(2)", {8, 4, 4}); }
TEST(Bottleneck, GradientCheckProjection) { resblock_check("bottleneck(2, stride=2)", {2, 6, 7}); }

TEST(Bottleneck, NamesAndShapesFollowTorchvision) {
  BoundLayer b("bottleneck(4, stride=2)", {8, 6, 6});
  EXPECT_EQ(b.layer->kind(), "bottleneck");
  EXPECT_EQ(b.out_sample, (Shape{16, 3, 3}));
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& p : b.layer->parameter_specs()) {
    names.push_back(p.suffix);
    shapes.push_back(p.shape);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight",
                                      "bn2.bias", "conv3.weight", "bn3.weight", "bn3.bias",
                                      "downsample.0.weight", "downsample.1.weight", "downsample.1.bias"}));
  // The stride sits in the 3x3 (v1.5), conv3 widens to 4 * width.
  EXPECT_EQ(shapes[0], (Shape{4, 8, 1, 1}));
  EXPECT_EQ(shapes[3], (Shape{4, 4, 3, 3}));
  EXPECT_EQ(shapes[6], (Shape{16, 4, 1, 1}));
  EXPECT_EQ(shapes[9], (Shape{16, 8, 1, 1}));
  // Same channels, stride 1: the identity shortcut.
  BoundLayer id("bottleneck(2)", {8, 4, 4});
  EXPECT_EQ(id.layer->parameter_specs().size(), 9u);
  EXPECT_EQ(id.layer->buffer_specs().size(), 9u);
}

// zero_init: the last batch norm's gamma starts at 0 (torchvision's
// zero_init_residual), the others at 1; without it all at 1.
TEST(Bottleneck, ZeroInitStartsTheLastGammaAtZero) {
  for (bool zero : {false, true}) {
    BoundLayer b(zero ? "bottleneck(2, zero_init)" : "bottleneck(2)", {8, 4, 4});
    const std::vector<float> p = to_host(b.params, b.n);
    std::int64_t offset = 0;
    for (const auto& spec : b.layer->parameter_specs()) {
      const std::int64_t n = shape_numel(spec.shape);
      if (spec.suffix.find("bn") == 0 && spec.suffix.find(".weight") != std::string::npos) {
        for (std::int64_t i = 0; i < n; ++i)
          EXPECT_EQ(p[offset + i], zero && spec.suffix == "bn3.weight" ? 0.0f : 1.0f) << spec.suffix;
      }
      offset += n;
    }
  }
  BoundLayer r("resblock(4, zero_init=true)", {4, 3, 3});
  EXPECT_EQ(to_host(r.params, r.n)[4 * 4 * 9 + 8 + 4 * 4 * 9], 0.0f);  // bn2.weight[0]
}

// gelu on a sequence, a flat and an image input, both forms; eps small against the
// curvature near 0 (x in [-1, 1]).
TEST(Gelu, GradientCheckBothForms) {
  for (const char* spec : {"gelu", "gelu(tanh)", "gelu(tanh=false)"})
    for (const Shape& in : {Shape{5, 6}, Shape{9}, Shape{2, 3, 4}}) {
      SCOPED_TRACE(std::string(spec) + " on " + shape_str(in));
      BoundLayer b(spec, in);
      EXPECT_EQ(b.out_sample, in);
      EXPECT_EQ(b.n, 0);
      grad_check(b, 3, CheckOptions{true, false, 1e-3, 1e-2, 1e-4});
    }
}

// PyTorch's values at a few points (torch 1.13, float64 printed to 7 digits).
TEST(Gelu, KnownValues) {
  const std::vector<float> xs = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
  // torch.nn.functional.gelu in float64, rounded to 7 decimals
  const std::vector<float> exact = {-0.0040497f, -0.1586553f, -0.1542688f, 0.0f,
                                    0.3457312f,  0.8413447f,  2.9959503f};
  const std::vector<float> tanh = {-0.0036374f, -0.1588080f, -0.1542860f, 0.0f,
                                   0.3457140f,  0.8411920f,  2.9963626f};
  for (bool approx : {false, true}) {
    BoundLayer b(approx ? "gelu(tanh)" : "gelu", {7});
    Tensor x = make_tensor({1, 7}, xs), y;
    b.layer->forward(x, y, false);
    const std::vector<float> got = to_host(y.data, 7), want = approx ? tanh : exact;
    for (std::size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(got[i], want[i], 5e-7f) << xs[i];
  }
}

TEST(LayerNorm, ParametersAndInit) {
  BoundLayer b("layernorm", {5, 4});
  EXPECT_EQ(b.layer->kind(), "layernorm");
  EXPECT_EQ(b.out_sample, (Shape{5, 4}));
  const auto specs = b.layer->parameter_specs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].suffix, "weight");
  EXPECT_EQ(specs[0].shape, Shape{4});
  EXPECT_EQ(specs[1].suffix, "bias");
  EXPECT_EQ(specs[1].shape, Shape{4});
  EXPECT_TRUE(b.layer->buffer_specs().empty());
  // weight 1, bias 0 (element by element: GCC 12.2 at -O3 miscompiles an EXPECT_EQ
  // against the 8-float literal {1, 1, 1, 1, 0, 0, 0, 0}, reading it as all ones)
  const std::vector<float> p = to_host(b.params, 8);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(p[j], 1.0f) << j;
    EXPECT_EQ(p[4 + j], 0.0f) << j;
  }
  BoundLayer flat("layernorm", {6});
  EXPECT_EQ(flat.n, 12);
}

TEST(LayerNorm, NormalisesEachRow) {
  BoundLayer b("layernorm", {3, 50});
  Tensor x = make_tensor({2, 3, 50}, random_values(300, 7, -3.0f, 5.0f)), y;
  b.layer->forward(x, y, true);
  ASSERT_EQ(y.shape, x.shape);
  const std::vector<float> yh = to_host(y.data, 300);
  for (int r = 0; r < 6; ++r) {
    double s = 0, ss = 0;
    for (int j = 0; j < 50; ++j) {
      s += yh[r * 50 + j];
      ss += double(yh[r * 50 + j]) * yh[r * 50 + j];
    }
    EXPECT_NEAR(s / 50, 0.0, 1e-6) << r;
    EXPECT_NEAR(ss / 50, 1.0, 1e-4) << r;  // biased variance, up to eps
  }
}

TEST(LayerNorm, GradientCheck) {
  for (const Shape& in : {Shape{4, 6}, Shape{7}, Shape{1, 5}}) {
    SCOPED_TRACE(shape_str(in));
    BoundLayer b("layernorm", in);
    test::from_host(b.params, random_values(b.n, 9, 0.5f, 1.5f));  // weight, bias away from 1, 0
    grad_check(b, 3, CheckOptions{true, false, 1e-3, 1e-2, 1e-4});
  }
}

// Parameter gradients add to what the buffer holds, or overwrite it while
// overwrite_gradients() is on; the same inputs give the same bits every time.
TEST(LayerNorm, GradientsAccumulateOverwriteAndRepeat) {
  BoundLayer b("layernorm", {33, 20});
  test::from_host(b.params, random_values(b.n, 3, 0.5f, 1.5f));
  Tensor x = make_tensor({5, 33, 20}, random_values(3300, 1, -2.0f, 2.0f)), y, dx;
  Tensor dy = make_tensor({5, 33, 20}, random_values(3300, 2));
  b.layer->forward(x, y, true);
  b.layer->backward(x, y, dy, dx);
  const std::vector<float> once = to_host(b.grads, b.n), dx_once = to_host(dx.data, dx.numel());
  b.layer->backward(x, y, dy, dx);
  const std::vector<float> twice = to_host(b.grads, b.n);
  for (std::int64_t i = 0; i < b.n; ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]) << i;
  b.layer->set_overwrite_gradients(true);
  b.layer->forward(x, y, true);
  b.layer->backward(x, y, dy, dx);
  EXPECT_EQ(to_host(b.grads, b.n), once);
  EXPECT_EQ(to_host(dx.data, dx.numel()), dx_once);

  // The parameter sums against the same sums in double on the host.
  const std::vector<float> xh = to_host(x.data, 3300), dyh = to_host(dy.data, 3300),
                           w = to_host(b.params, 20);
  std::vector<double> dw(20, 0.0), db(20, 0.0);
  for (int r = 0; r < 165; ++r) {
    double mu = 0, var = 0;
    for (int j = 0; j < 20; ++j) mu += xh[r * 20 + j];
    mu /= 20;
    for (int j = 0; j < 20; ++j) var += (xh[r * 20 + j] - mu) * (xh[r * 20 + j] - mu);
    const double rstd = 1.0 / std::sqrt(var / 20 + 1e-5);
    for (int j = 0; j < 20; ++j) {
      dw[j] += dyh[r * 20 + j] * (xh[r * 20 + j] - mu) * rstd;
      db[j] += dyh[r * 20 + j];
    }
  }
  for (int j = 0; j < 20; ++j) {
    EXPECT_NEAR(once[j], dw[j], 1e-5 * (1 + std::fabs(dw[j]))) << j;
    EXPECT_NEAR(once[20 + j], db[j], 1e-5 * (1 + std::fabs(db[j]))) << j;
  }
}

// A layer that ran a batch of 8 then runs one of 2 on a prefix of its buffers (grown
// only) and must give, forward and backward, what a fresh layer gives on the 2 alone.
// random_params: both start from the same random parameters (else the layer's init).
void expect_smaller_batch_after_larger(const std::string& spec, const Shape& sample, bool random_params) {
  BoundLayer big(spec, sample), alone(spec, sample);
  if (random_params) {
    test::from_host(big.params, random_values(big.n, 4, -0.5f, 0.5f));
    test::from_host(alone.params, to_host(big.params, big.n));
  }
  big.layer->set_overwrite_gradients(true);
  alone.layer->set_overwrite_gradients(true);
  std::int64_t per = 1;
  for (std::int64_t e : sample) per *= e;
  Shape s8 = {8}, s2 = {2};
  s8.insert(s8.end(), sample.begin(), sample.end());
  s2.insert(s2.end(), sample.begin(), sample.end());
  Tensor x8 = make_tensor(s8, random_values(std::size_t(8 * per), 5)),
         x2 = make_tensor(s2, random_values(std::size_t(2 * per), 6));
  Tensor dy8 = make_tensor(s8, random_values(std::size_t(8 * per), 7)),
         dy2 = make_tensor(s2, random_values(std::size_t(2 * per), 8));
  Tensor y, dx, ya, dxa;
  big.layer->forward(x8, y, true);
  big.layer->backward(x8, y, dy8, dx);
  big.layer->forward(x2, y, true);
  big.layer->backward(x2, y, dy2, dx);
  alone.layer->forward(x2, ya, true);
  alone.layer->backward(x2, ya, dy2, dxa);
  EXPECT_EQ(to_host(y.data, 2 * per), to_host(ya.data, 2 * per));
  EXPECT_EQ(to_host(dx.data, 2 * per), to_host(dxa.data, 2 * per));
  EXPECT_EQ(to_host(big.grads, big.n), to_host(alone.grads, alone.n));
}

// layernorm: the prefix holds the rows' mean, rstd and the partial sums.
TEST(LayerNorm, SmallerBatchAfterLarger) { expect_smaller_batch_after_larger("layernorm", {4, 8}, false); }

// linear(n) on (T, d) acts on the last dimension, as nn.Linear on (B, T, d): each
// token as a flat sample would be.
TEST(Linear, SequenceInputActsPerToken) {
  BoundLayer seq("linear(6)", {4, 5});
  EXPECT_EQ(seq.out_sample, (Shape{4, 6}));
  EXPECT_EQ(seq.layer->parameter_specs()[0].shape, (Shape{6, 5}));
  grad_check(seq, 3);

  BoundLayer flat("linear(6)", {5});
  test::from_host(flat.params, to_host(seq.params, seq.n));
  const std::vector<float> xs = random_values(3 * 4 * 5, 31), dys = random_values(3 * 4 * 6, 32);
  Tensor xq = make_tensor({3, 4, 5}, xs), xf = make_tensor({12, 5}, xs), yq, yf, dxq, dxf;
  seq.layer->set_overwrite_gradients(true);
  flat.layer->set_overwrite_gradients(true);
  seq.layer->forward(xq, yq, true);
  flat.layer->forward(xf, yf, true);
  EXPECT_EQ(yq.shape, (Shape{3, 4, 6}));
  EXPECT_LE(test::max_relative_error(to_host(yq.data, 72), to_host(yf.data, 72)), 1e-6);
  Tensor dyq = make_tensor({3, 4, 6}, dys), dyf = make_tensor({12, 6}, dys);
  seq.layer->backward(xq, yq, dyq, dxq);
  flat.layer->backward(xf, yf, dyf, dxf);
  EXPECT_EQ(dxq.shape, (Shape{3, 4, 5}));
  EXPECT_LE(test::max_relative_error(to_host(dxq.data, 60), to_host(dxf.data, 60)), 1e-6);
  EXPECT_LE(test::max_relative_error(to_host(seq.grads, seq.n), to_host(flat.grads, flat.n)), 1e-6);
}

// The summary lists the layers with their shapes and parameter counts, and the
// parameter table has layernorm's PyTorch names.
TEST(Model, TransformerLayersInSummaryAndNames) {
  const std::vector<std::string> specs = {"linear(16)", "layernorm", "gelu(tanh)",
                                          "linear(8)",  "gelu",      "layernorm(eps=1e-6)"};
  Model m(specs, {5, 12}, 0);
  // "#  layer  output  parameters" rows: index, spec, shape, count
  std::istringstream summary(m.summary());
  std::vector<std::string> rows;
  for (std::string line; std::getline(summary, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), specs.size() + 3) << m.summary();
  const std::vector<std::string> shapes = {"(5, 16)", "(5, 16)", "(5, 16)", "(5, 8)", "(5, 8)", "(5, 8)"};
  const std::vector<std::string> counts = {"208", "32", "0", "136", "0", "16"};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::istringstream row(rows[i + 2]);
    std::string index, spec, shape_a, shape_b, count;
    row >> index >> spec >> shape_a >> shape_b >> count;
    EXPECT_EQ(index, std::to_string(i)) << rows[i + 2];
    EXPECT_EQ(spec, specs[i]) << rows[i + 2];
    EXPECT_EQ(shape_a + " " + shape_b, shapes[i]) << rows[i + 2];
    EXPECT_EQ(count, counts[i]) << rows[i + 2];
  }
  std::vector<std::string> names;
  for (const auto& e : m.parameter_table()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                             "layers.1.bias", "layers.3.weight", "layers.3.bias",
                                             "layers.5.weight", "layers.5.bias"}));
  EXPECT_EQ(m.num_parameters(), 208 + 32 + 136 + 16);
}

// attention(heads[, causal]) against finite differences: every gradient (x and the
// four parameters, the biases moved off their initial 0), several widths and head
// counts, one token, one head; the block path (block=N) with blocks that do not divide
// T and blocks of one query.
TEST(Attention, GradientCheck) {
  const std::vector<std::pair<std::string, Shape>> cases = {
      {"attention(2)", {5, 8}},          {"attention(3, causal)", {7, 12}},
      {"attention(2)", {1, 8}},          {"attention(2, causal)", {1, 8}},
      {"attention(1)", {4, 6}},          {"attention(1, causal)", {6, 4}},
      {"attention(4, causal)", {3, 8}},  {"attention(3, causal, block=3)", {7, 12}},
      {"attention(2, block=2)", {5, 8}}, {"attention(1, causal, block=1)", {6, 4}}};
  for (const auto& [spec, in] : cases) {
    SCOPED_TRACE(spec + " on " + shape_str(in));
    BoundLayer b(spec, in);
    EXPECT_EQ(b.out_sample, in);
    test::from_host(b.params, random_values(b.n, 21, -0.5f, 0.5f));
    grad_check(b, 2, CheckOptions{true, false, 1e-2, 1e-2, 1e-4});
  }
}

TEST(Attention, ParametersAndInit) {
  BoundLayer b("attention(4, causal)", {6, 16});
  EXPECT_EQ(b.layer->kind(), "attention");
  const auto& a = dynamic_cast<const Attention&>(*b.layer);
  EXPECT_EQ(a.heads(), 4);
  EXPECT_TRUE(a.causal());
  const auto specs = b.layer->parameter_specs();
  ASSERT_EQ(specs.size(), 4u);
  const std::vector<std::pair<std::string, Shape>> want = {{"in_proj_weight", {48, 16}},
                                                           {"in_proj_bias", {48}},
                                                           {"out_proj.weight", {16, 16}},
                                                           {"out_proj.bias", {16}}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(specs[i].suffix, want[i].first);
    EXPECT_EQ(specs[i].shape, want[i].second) << want[i].first;
  }
  EXPECT_TRUE(b.layer->buffer_specs().empty());
  ASSERT_EQ(b.n, 48 * 16 + 48 + 16 * 16 + 16);
  // xavier_uniform_ on (48, 16): U(-sqrt(6 / 64), sqrt(6 / 64)); out_proj.weight as
  // nn.Linear(16, 16): U(-1/4, 1/4); biases 0. Each weight spread over most of its range.
  const std::vector<float> p = to_host(b.params, b.n);
  auto range = [&](std::int64_t from, std::int64_t n) {
    return std::make_pair(*std::min_element(p.begin() + from, p.begin() + from + n),
                          *std::max_element(p.begin() + from, p.begin() + from + n));
  };
  const float in_bound = std::sqrt(6.0f / 64.0f);
  const auto [in_lo, in_hi] = range(0, 48 * 16);
  EXPECT_GE(in_lo, -in_bound);
  EXPECT_LE(in_hi, in_bound);
  EXPECT_LT(in_lo, -0.9f * in_bound);
  EXPECT_GT(in_hi, 0.9f * in_bound);
  const auto [out_lo, out_hi] = range(48 * 16 + 48, 256);
  EXPECT_GE(out_lo, -0.25f);
  EXPECT_LE(out_hi, 0.25f);
  EXPECT_LT(out_lo, -0.2f);
  EXPECT_GT(out_hi, 0.2f);
  for (std::int64_t j = 0; j < 48; ++j) EXPECT_EQ(p[48 * 16 + j], 0.0f) << j;
  for (std::int64_t j = 0; j < 16; ++j) EXPECT_EQ(p[48 * 16 + 48 + 256 + j], 0.0f) << j;
}

// Causal: changing token t of a sample leaves the outputs of its tokens before t as
// they were, bit for bit, and changes the token's own; without `causal` the earlier
// tokens change too. A gradient at token t alone reaches no input after t.
TEST(Attention, CausalMaskHidesLaterTokens) {
  const std::int64_t B = 2, T = 6, d = 8, t = 3;
  for (const char* spec :
       {"attention(2, causal)", "attention(2)", "attention(2, causal, block=2)", "attention(2, block=4)"}) {
    SCOPED_TRACE(spec);
    const bool causal = std::string(spec).find("causal") != std::string::npos;
    BoundLayer b(spec, {T, d});
    test::from_host(b.params, random_values(b.n, 5, -0.5f, 0.5f));
    std::vector<float> xs = random_values(B * T * d, 6);
    Tensor x = make_tensor({B, T, d}, xs), y, y2;
    b.layer->forward(x, y, true);
    const std::vector<float> before = to_host(y.data, y.numel());
    for (std::int64_t j = 0; j < d; ++j) xs[(1 * T + t) * d + j] += 0.5f;  // sample 1, token t
    Tensor x2 = make_tensor({B, T, d}, xs);
    b.layer->forward(x2, y2, true);
    const std::vector<float> after = to_host(y2.data, y2.numel());
    for (std::int64_t i = 0; i < T * d; ++i)
      EXPECT_EQ(after[i], before[i]) << "sample 0, " << i;  // untouched
    std::int64_t earlier_changed = 0;
    for (std::int64_t i = T * d; i < (T + t) * d; ++i) earlier_changed += after[i] != before[i];
    if (causal)
      EXPECT_EQ(earlier_changed, 0);
    else
      EXPECT_EQ(earlier_changed, t * d);
    for (std::int64_t i = (T + t) * d; i < (T + t + 1) * d; ++i) EXPECT_NE(after[i], before[i]) << i;

    // dy at token t of each sample only: dx is 0 at every later token when causal.
    std::vector<float> dys(B * T * d, 0.0f);
    for (std::int64_t s = 0; s < B; ++s)
      for (std::int64_t j = 0; j < d; ++j) dys[(s * T + t) * d + j] = 1.0f + 0.1f * float(j);
    Tensor dy = make_tensor({B, T, d}, dys), dx;
    b.layer->backward(x2, y2, dy, dx);
    const std::vector<float> dxh = to_host(dx.data, dx.numel());
    std::int64_t later_nonzero = 0;
    for (std::int64_t s = 0; s < B; ++s)
      for (std::int64_t i = (s * T + t + 1) * d; i < (s + 1) * T * d; ++i) later_nonzero += dxh[i] != 0.0f;
    if (causal)
      EXPECT_EQ(later_nonzero, 0);
    else
      EXPECT_EQ(later_nonzero, B * (T - t - 1) * d);
  }
}

// Parameter gradients add to what the buffer holds, or overwrite it while
// overwrite_gradients() is on; the same inputs give the same bits every time, and
// without the input gradient (the model's first layer) the parameter gradients are
// the same.
TEST(Attention, GradientsAccumulateOverwriteAndRepeat) {
  for (const char* spec : {"attention(4, causal)", "attention(4, causal, block=4)"}) {
    SCOPED_TRACE(spec);
    BoundLayer b(spec, {9, 16});
    test::from_host(b.params, random_values(b.n, 3, -0.5f, 0.5f));
    Tensor x = make_tensor({3, 9, 16}, random_values(432, 1, -2.0f, 2.0f)), y, dx;
    Tensor dy = make_tensor({3, 9, 16}, random_values(432, 2));
    b.layer->forward(x, y, true);
    const std::vector<float> y_once = to_host(y.data, y.numel());
    b.layer->backward(x, y, dy, dx);
    const std::vector<float> once = to_host(b.grads, b.n), dx_once = to_host(dx.data, dx.numel());
    b.layer->backward(x, y, dy, dx);
    const std::vector<float> twice = to_host(b.grads, b.n);
    // The GEMMs add the second gradient into the first (beta = 1): not the doubled bits.
    std::vector<float> doubled(once);
    for (float& v : doubled) v *= 2;
    EXPECT_LE(test::max_relative_error(twice, doubled), 1e-6);
    EXPECT_EQ(to_host(dx.data, dx.numel()), dx_once);
    b.layer->set_overwrite_gradients(true);
    b.layer->forward(x, y, true);
    EXPECT_EQ(to_host(y.data, y.numel()), y_once);
    b.layer->backward(x, y, dy, dx);
    EXPECT_EQ(to_host(b.grads, b.n), once);
    EXPECT_EQ(to_host(dx.data, dx.numel()), dx_once);

    BoundLayer first(spec, {9, 16});
    test::from_host(first.params, to_host(b.params, b.n));
    first.layer->set_needs_input_grad(false);
    Tensor y1, dx1;
    first.layer->forward(x, y1, true);
    first.layer->backward(x, y1, dy, dx1);
    EXPECT_EQ(to_host(first.grads, first.n), once);
    EXPECT_EQ(dx1.numel(), 0);
  }
}

// A smaller batch after a larger one uses a prefix of the buffers and gives what it
// gives alone.
TEST(Attention, SmallerBatchAfterLarger) {
  expect_smaller_batch_after_larger("attention(2, causal)", {5, 8}, true);
  expect_smaller_batch_after_larger("attention(2, causal, block=2)", {5, 8}, true);
}

// The layers' temporaries share the process's slots (tensor.hpp's shared_scratch):
// layers of other shapes (a larger first, so the slots grow between the two calls of
// the other) interleaved as a model runs them, forward down and backward up, give
// each the bits it gives alone, on the keep and block paths; no layer holds a slot
// outside its call, and a slot that grows lets go of its old buffer.
TEST(SharedScratch, LayersInterleavedGiveWhatEachGivesAlone) {
  for (const char* option : {"", ", block=3"}) {
    const std::string small_spec = std::string("transformer_block(2, causal") + option + ")",
                      large_spec = std::string("transformer_block(4") + option + ")";
    SCOPED_TRACE(small_spec + " and " + large_spec);
    const auto run = [](BoundLayer& b, const Tensor& x, const Tensor& dy, Tensor& y, Tensor& dx) {
      b.layer->forward(x, y, true);
      b.layer->backward(x, y, dy, dx);
    };
    BoundLayer small_alone(small_spec, {7, 8}), small(small_spec, {7, 8}), large(large_spec, {11, 16});
    for (BoundLayer* b : {&small_alone, &small, &large})
      test::from_host(b->params, random_values(b->n, 5, -0.5f, 0.5f));
    const Tensor xs = make_tensor({2, 7, 8}, random_values(112, 6, -2.0f, 2.0f)),
                 dys = make_tensor({2, 7, 8}, random_values(112, 7)),
                 xl = make_tensor({3, 11, 16}, random_values(528, 8, -2.0f, 2.0f)),
                 dyl = make_tensor({3, 11, 16}, random_values(528, 9));
    Tensor y0, dx0;
    run(small_alone, xs, dys, y0, dx0);
    // small forward, large forward and backward (its slots outgrow small's), small backward
    Tensor y1, dx1, yl, dxl;
    small.layer->forward(xs, y1, true);
    run(large, xl, dyl, yl, dxl);
    small.layer->backward(xs, y1, dys, dx1);
    EXPECT_EQ(to_host(y1.data, y1.numel()), to_host(y0.data, y0.numel()));
    EXPECT_EQ(to_host(dx1.data, dx1.numel()), to_host(dx0.data, dx0.numel()));
    EXPECT_EQ(to_host(small.grads, small.n), to_host(small_alone.grads, small_alone.n));
    BoundLayer large_alone(large_spec, {11, 16});
    test::from_host(large_alone.params, random_values(large_alone.n, 5, -0.5f, 0.5f));
    Tensor y2, dx2;
    run(large_alone, xl, dyl, y2, dx2);
    EXPECT_EQ(to_host(dxl.data, dxl.numel()), to_host(dx2.data, dx2.numel()));
    EXPECT_EQ(to_host(large.grads, large.n), to_host(large_alone.grads, large_alone.n));
  }
  // Every call found its slots large enough: none resized a held view past them.
  EXPECT_EQ(shared_scratch_outgrown(), 0);
  // The slots themselves: one buffer a slot, held while a SharedScratch lives.
  View1 first, kept;
  {
    SharedScratch scratch;
    scratch.hold(first, ScratchSlot::block_df, 1000, "test::slot");
    ASSERT_GE(first.extent(0), 1000u);
    kept = first;
  }
  EXPECT_EQ(first.extent(0), 0u);
  {
    View1 again, other;  // before the scratch that empties them
    SharedScratch scratch;
    scratch.hold(again, ScratchSlot::block_df, 10, "test::slot");
    EXPECT_EQ(again.data(), kept.data());  // large enough: the same buffer
    scratch.hold(other, ScratchSlot::block_dc, 10, "test::slot");
    EXPECT_NE(other.data(), kept.data());
  }
  {
    View1 grown;
    SharedScratch scratch;
    scratch.hold(grown, ScratchSlot::block_df, std::int64_t(kept.extent(0)) + 1, "test::slot");
    EXPECT_NE(grown.data(), kept.data());
    EXPECT_EQ(kept.use_count(), 1);  // the slot let go of the old buffer: only this test holds it
  }
}

// The block path against the keep path on the same parameters and data, causal and
// not, blocks that divide T and blocks that do not: the same arithmetic row by row,
// GEMMs of other shapes and dK, dV summed over the query blocks, so within float
// rounding, tensor by tensor (Q's, K's and V's thirds of in_proj apart); one block of
// all T (block=T): the keep path's bits.
TEST(Attention, BlocksAgreeWithKeep) {
  const std::int64_t B = 3, T = 40, d = 32;
  for (const char* opts : {"", ", causal"})
    for (int rows : {7, 8, 16, 39, 40}) {
      const std::string keep_spec = std::string("attention(4") + opts + ", block=0)",
                        block_spec =
                            std::string("attention(4") + opts + ", block=" + std::to_string(rows) + ")";
      SCOPED_TRACE(block_spec);
      BoundLayer keep(keep_spec, {T, d}), blocks(block_spec, {T, d});
      EXPECT_EQ(dynamic_cast<const Attention&>(*keep.layer).block_rows(), 0);
      EXPECT_EQ(dynamic_cast<const Attention&>(*blocks.layer).block_rows(), rows);
      const std::vector<float> p = random_values(keep.n, 31, -0.3f, 0.3f);
      test::from_host(keep.params, p);
      test::from_host(blocks.params, p);
      Tensor x = make_tensor({B, T, d}, random_values(B * T * d, 32, -2.0f, 2.0f));
      Tensor dy = make_tensor({B, T, d}, random_values(B * T * d, 33));
      Tensor yk, yb, dxk, dxb;
      keep.layer->forward(x, yk, true);
      blocks.layer->forward(x, yb, true);
      keep.layer->backward(x, yk, dy, dxk);
      blocks.layer->backward(x, yb, dy, dxb);
      const std::vector<float> gk = to_host(keep.grads, keep.n), gb = to_host(blocks.grads, blocks.n);
      // (name, offset, size) in the gradient buffer: in_proj's weight by thirds
      const std::vector<std::tuple<const char*, std::int64_t, std::int64_t>> parts = {
          {"dW_q", 0, d * d},
          {"dW_k", d * d, d * d},
          {"dW_v", 2 * d * d, d * d},
          {"db_in", 3 * d * d, 3 * d},
          {"dW_out", 3 * d * d + 3 * d, d * d},
          {"db_out", 4 * d * d + 3 * d, d}};
      if (rows == T) {
        EXPECT_EQ(to_host(yb.data, yb.numel()), to_host(yk.data, yk.numel()));
        EXPECT_EQ(to_host(dxb.data, dxb.numel()), to_host(dxk.data, dxk.numel()));
        EXPECT_EQ(gb, gk);
        continue;
      }
      EXPECT_LE(test::max_relative_error(to_host(yb.data, yb.numel()), to_host(yk.data, yk.numel())), 1e-6);
      EXPECT_LE(test::max_relative_error(to_host(dxb.data, dxb.numel()), to_host(dxk.data, dxk.numel())),
                1e-6);
      for (const auto& [name, at, size] : parts)
        EXPECT_LE(test::max_relative_error(std::vector<float>(gb.begin() + at, gb.begin() + at + size),
                                           std::vector<float>(gk.begin() + at, gk.begin() + at + size)),
                  1e-6)
            << name;
    }
}

// One run of attention at `precision` on parameters, x and dy from fixed seeds:
// y, dx and the parameter gradients, in that order.
std::vector<std::vector<float>> attention_run(const std::string& spec, std::int64_t B, std::int64_t T,
                                              std::int64_t d, Precision precision) {
  BoundLayer l(spec, {T, d});
  l.layer->set_precision(precision);
  test::from_host(l.params, random_values(l.n, 41, -0.3f, 0.3f));
  Tensor x = make_tensor({B, T, d}, random_values(B * T * d, 42, -2.0f, 2.0f));
  Tensor dy = make_tensor({B, T, d}, random_values(B * T * d, 43));
  Tensor y, dx;
  l.layer->forward(x, y, true);
  l.layer->backward(x, y, dy, dx);
  return {to_host(y.data, y.numel()), to_host(dx.data, dx.numel()), to_host(l.grads, l.n)};
}

// `fused` asks for the backend's fused kernels where it has them (the GPU build at
// bf16); the host has none, and the layer takes its path without them, bit for bit.
TEST(Attention, FusedOptionOnTheHost) {
  EXPECT_TRUE(make_layer("transformer_block(2, causal, fused)") != nullptr);
  std::unique_ptr<Layer> l = make_layer("attention(2, causal, fused)");
  l->output_shape({40, 16});
#if defined(KOKKOS_ENABLE_CUDA)
  GTEST_SKIP() << "the GPU build: Attention.FusedAgreesWithBlocksOnTheGpu";
#else
  l->set_precision(Precision::bf16);
  EXPECT_FALSE(dynamic_cast<const Attention&>(*l).runs_fused());
  for (Precision p : {Precision::fp32, Precision::bf16})
    EXPECT_EQ(attention_run("attention(2, causal, fused)", 3, 40, 16, p),
              attention_run("attention(2, causal)", 3, 40, 16, p))
        << precision_name(p);
#endif
}

#if defined(KOKKOS_ENABLE_CUDA)
// On the GPU at bf16 the fused kernels (cuda/flash_attention.cu) against the block
// path at bf16, whose GEMMs take the same bf16 operands: the probabilities are
// rounded to bf16 at other points (the fused path before normalising), so within 3e-2
// of each tensor's largest value (an emulation of both in numpy gave at most 8e-3);
// and against the block path in fp32 within 6e-2 (the emulation: 2.7e-2), lest a
// fault of the block path on the GPU hide one of the kernels'. Tiles that do not
// divide T, causal and not, every head size the kernels take, 1 to 3 key tiles per
// query tile; and the same bits when run again (no atomics). Compiled, not run, until
// a GPU session runs it.
TEST(Attention, FusedAgreesWithBlocksOnTheGpu) {
  struct Case {
    std::int64_t heads, head_size, T;
    bool causal;
  };
  for (const Case& c : {Case{2, 16, 5, true}, Case{2, 32, 64, false}, Case{4, 64, 100, true},
                        Case{2, 64, 130, false}, Case{2, 64, 128, true}, Case{1, 128, 70, true}}) {
    const std::int64_t d = c.heads * c.head_size;
    const std::string opts = std::to_string(c.heads) + (c.causal ? ", causal" : "");
    SCOPED_TRACE("heads " + opts + ", head size " + std::to_string(c.head_size) + ", T " +
                 std::to_string(c.T));
    std::unique_ptr<Layer> probe = make_layer("attention(" + opts + ", fused)");
    probe->output_shape({c.T, d});
    probe->set_precision(Precision::bf16);
    if (!dynamic_cast<const Attention&>(*probe).runs_fused()) GTEST_SKIP() << "no fused kernels on this GPU";
    const auto fused = attention_run("attention(" + opts + ", fused)", 3, c.T, d, Precision::bf16);
    const auto blocks = attention_run("attention(" + opts + ", block=32)", 3, c.T, d, Precision::bf16);
    const auto fp32 = attention_run("attention(" + opts + ", block=32)", 3, c.T, d, Precision::fp32);
    const char* names[] = {"y", "dx", "parameter gradients"};
    for (int t = 0; t < 3; ++t) {
      for (float v : fused[t]) ASSERT_TRUE(std::isfinite(v)) << names[t];
      EXPECT_LE(test::max_relative_error(fused[t], blocks[t]), 3e-2)
          << names[t] << " against the block path, bf16";
      EXPECT_LE(test::max_relative_error(fused[t], fp32[t]), 6e-2)
          << names[t] << " against the block path, fp32";
    }
    EXPECT_EQ(attention_run("attention(" + opts + ", fused)", 3, c.T, d, Precision::bf16), fused);
  }
}
#endif

// The default path: keep up to R tokens, blocks of R above; R 128 on the host, on a
// GPU the largest power of two up to 512 (at least 16) whose (heads, R, T) scores take
// at most 64 MiB; block=N caps at T; transformer_block passes its option on.
TEST(Attention, DefaultBlockRows) {
  const auto rows = [](const std::string& spec, std::int64_t T, std::int64_t d) {
    std::unique_ptr<Layer> l = make_layer(spec);
    l->output_shape({T, d});
    return dynamic_cast<const Attention&>(*l).block_rows();
  };
#if defined(KOKKOS_ENABLE_CUDA)
  EXPECT_EQ(rows("attention(12, causal)", 512, 768), 0);
  EXPECT_EQ(rows("attention(12, causal)", 513, 768), 512);
  EXPECT_EQ(rows("attention(12, causal)", 1024, 768), 512);
  EXPECT_EQ(rows("attention(12, causal)", 4096, 768), 256);  // 48 MiB of scores a block
  EXPECT_EQ(rows("attention(16)", 1 << 20, 1024), 16);       // the floor, over 64 MiB
#else
  EXPECT_EQ(rows("attention(4, causal)", 64, 64), 0);
  EXPECT_EQ(rows("attention(4, causal)", 128, 64), 0);
  EXPECT_EQ(rows("attention(4, causal)", 129, 64), 128);
  EXPECT_EQ(rows("attention(12)", 4096, 768), 128);
#endif
  EXPECT_EQ(rows("attention(2, block=0)", 4096, 8), 0);
  EXPECT_EQ(rows("attention(2, block=64)", 4096, 8), 64);
  EXPECT_EQ(rows("attention(2, block=64)", 40, 8), 40);
  EXPECT_EQ(rows("attention(2, block=5)", 40, 8), 5);
  std::unique_ptr<Layer> blk = make_layer("transformer_block(2, causal, block=5)");
  blk->output_shape({40, 8});
  const auto* tb = dynamic_cast<const TransformerBlock*>(blk.get());
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->attention().block_rows(), 5);
}

// One head over one token attends to itself alone: y = (x W_v^T + b_v) W_out^T + b_out,
// whatever Q and K are.
TEST(Attention, OneTokenIsTheValueProjection) {
  const std::int64_t d = 6;
  BoundLayer b("attention(3)", {1, d});
  const std::vector<float> p = random_values(b.n, 9, -0.5f, 0.5f);
  test::from_host(b.params, p);
  const std::vector<float> xs = random_values(2 * d, 10);
  Tensor x = make_tensor({2, 1, d}, xs), y;
  b.layer->forward(x, y, false);
  const std::vector<float> got = to_host(y.data, y.numel());
  const float *w_in = p.data(), *b_in = w_in + 3 * d * d, *w_out = b_in + 3 * d, *b_out = w_out + d * d;
  for (std::int64_t s = 0; s < 2; ++s) {
    std::vector<double> v(d);
    for (std::int64_t i = 0; i < d; ++i) {
      v[i] = b_in[2 * d + i];
      for (std::int64_t j = 0; j < d; ++j) v[i] += double(w_in[(2 * d + i) * d + j]) * xs[s * d + j];
    }
    for (std::int64_t i = 0; i < d; ++i) {
      double want = b_out[i];
      for (std::int64_t j = 0; j < d; ++j) want += double(w_out[i * d + j]) * v[j];
      EXPECT_NEAR(got[s * d + i], want, 1e-6) << s << ", " << i;
    }
  }
}

std::string spec_error(const std::string& spec, const Shape& in = {3, 8, 8}) {
  try {
    BoundLayer b(spec, in);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Registry, CnnSpecsAndErrors) {
  EXPECT_EQ(make_layer("Conv2d( 32, 3, PAD = 1 )")->kind(), "conv2d");
  EXPECT_EQ(make_layer("batchnorm2d(sync)")->kind(), "batchnorm2d");
  EXPECT_EQ(make_layer("resblock(16,stride=2)")->kind(), "resblock");
  EXPECT_EQ(spec_error("conv2d(32)"),
            "conv2d takes 2 arguments, got 1; usage: conv2d(out, k[, stride=s][, pad=p][, bias=false])");
  EXPECT_EQ(spec_error("conv2d(32, 3, dilation=2)"),
            "conv2d has no option 'dilation'; usage: conv2d(out, k[, stride=s][, pad=p][, bias=false])");
  EXPECT_EQ(spec_error("conv2d(32, 3, stride=0)"), "stride must be >= 1");
  EXPECT_EQ(spec_error("conv2d(32, 3, pad=-1)"), "pad must be >= 0");
  EXPECT_EQ(spec_error("conv2d(32, 3, bias=maybe)"), "bias must be true or false, got 'maybe'");
  EXPECT_EQ(spec_error("conv2d(0, 3)"), "out channels must be >= 1");
  EXPECT_EQ(spec_error("conv2d(8, 11)"), "kernel 11 is larger than the padded input (3, 8, 8)");
  EXPECT_EQ(spec_error("conv2d(8, 3)", {10}),
            "conv2d needs an image input (channels, height, width) but gets (10)");
  EXPECT_EQ(spec_error("conv2d(pad=1, 8, 3)"),
            "conv2d: positional argument '8' after an option; usage: conv2d(out, k[, stride=s][, pad=p][, "
            "bias=false])");
  EXPECT_EQ(spec_error("maxpool(2, stride=1, stride=2)"), "maxpool: option 'stride' given twice");
  EXPECT_EQ(spec_error("maxpool(9)"), "kernel 9 is larger than the input (3, 8, 8)");
  EXPECT_EQ(spec_error("batchnorm2d(async)"),
            "batchnorm2d takes 0 arguments, got 1; usage: batchnorm2d[(sync)]");
  EXPECT_EQ(spec_error("batchnorm2d(sync=maybe)"), "sync must be true or false, got 'maybe'");
  EXPECT_EQ(spec_error("globalavgpool", {8}),
            "globalavgpool needs an image input (channels, height, width) but gets (8)");
  EXPECT_EQ(spec_error("resblock(8, stride=x)"), "stride must be an integer, got 'x'");
  EXPECT_EQ(spec_error("maxpool(3, stride=2, pad=2)"), "pad must be at most half the kernel size (3)");
  EXPECT_EQ(spec_error("maxpool(3, pad=-1)"), "pad must be >= 0");
  EXPECT_EQ(spec_error("avgpool(7, pad=1)", {3, 4, 4}),
            "kernel 7 is larger than the input (3, 4, 4) padded by 1");
  EXPECT_EQ(spec_error("bottleneck(0)"), "width must be >= 1");
  EXPECT_EQ(spec_error("bottleneck(4, zero_init=maybe)"), "zero_init must be true or false, got 'maybe'");
  EXPECT_EQ(spec_error("bottleneck(4, groups=32)"),
            "bottleneck has no option 'groups'; usage: bottleneck(width[, stride=s][, zero_init][, sync])");
  EXPECT_EQ(spec_error("bottleneck(4)", {12}),
            "bottleneck needs an image input (channels, height, width) but gets (12)");
}

TEST(Registry, TransformerSpecsAndErrors) {
  EXPECT_EQ(make_layer("GELU")->kind(), "gelu");
  EXPECT_FALSE(dynamic_cast<Gelu&>(*make_layer("gelu")).tanh_approximation());
  EXPECT_TRUE(dynamic_cast<Gelu&>(*make_layer("gelu( Tanh )")).tanh_approximation());
  EXPECT_TRUE(dynamic_cast<Gelu&>(*make_layer("gelu(tanh=true)")).tanh_approximation());
  EXPECT_FALSE(dynamic_cast<Gelu&>(*make_layer("gelu(tanh=false)")).tanh_approximation());
  EXPECT_EQ(make_layer("LayerNorm")->kind(), "layernorm");
  EXPECT_EQ(make_layer("layernorm(eps=1e-6)")->kind(), "layernorm");
  EXPECT_NE(known_layers().find("gelu[(tanh)], layernorm[(eps=e)]"), std::string::npos) << known_layers();
  EXPECT_EQ(spec_error("gelu(foo)", {8}), "gelu takes 0 arguments, got 1; usage: gelu[(tanh)]");
  EXPECT_EQ(spec_error("gelu(approximate=tanh)", {8}),
            "gelu has no option 'approximate'; usage: gelu[(tanh)]");
  EXPECT_EQ(spec_error("gelu(tanh=maybe)", {8}), "tanh must be true or false, got 'maybe'");
  EXPECT_EQ(spec_error("layernorm(3)", {8}), "layernorm takes 0 arguments, got 1; usage: layernorm[(eps=e)]");
  EXPECT_EQ(spec_error("layernorm(eps=0)", {8}), "eps must be > 0");
  EXPECT_EQ(spec_error("layernorm(eps=small)", {8}), "eps must be a number, got 'small'");
  EXPECT_EQ(spec_error("layernorm"),
            "layernorm needs a flat (features) or sequence (tokens, features) input but gets (3, 8, 8)");
  EXPECT_EQ(spec_error("linear(4)"),
            "linear needs a flat input (features) but gets (3, 8, 8): add 'flatten' before it");
}

TEST(Registry, AttentionSpecsAndErrors) {
  EXPECT_EQ(make_layer("Attention(4)")->kind(), "attention");
  EXPECT_FALSE(dynamic_cast<Attention&>(*make_layer("attention(4)")).causal());
  EXPECT_TRUE(dynamic_cast<Attention&>(*make_layer("attention( 4, Causal )")).causal());
  EXPECT_TRUE(dynamic_cast<Attention&>(*make_layer("attention(4, causal=true)")).causal());
  EXPECT_FALSE(dynamic_cast<Attention&>(*make_layer("attention(4, causal=false)")).causal());
  EXPECT_EQ(dynamic_cast<Attention&>(*make_layer("attention(2, causal, dropout=0)")).heads(), 2);
  EXPECT_NE(known_layers().find(", attention(heads[, causal][, block=N][, fused])"), std::string::npos)
      << known_layers();
  EXPECT_THROW(make_layer("attention(2, block=-1)"), InputError);
  EXPECT_EQ(spec_error("attention(3)", {5, 8}),
            "attention: the features (8) are not a multiple of the heads (3)");
  EXPECT_EQ(spec_error("attention(16, causal)", {5, 8}),
            "attention: the features (8) are not a multiple of the heads (16)");
  EXPECT_EQ(spec_error("attention", {5, 8}),
            "attention takes 1 argument, got 0; usage: attention(heads[, causal][, block=N][, fused])");
  EXPECT_EQ(spec_error("attention(0)", {5, 8}), "heads must be >= 1");
  EXPECT_EQ(spec_error("attention(two)", {5, 8}), "heads must be an integer, got 'two'");
  EXPECT_EQ(spec_error("attention(2, causal=maybe)", {5, 8}), "causal must be true or false, got 'maybe'");
  EXPECT_EQ(spec_error("attention(2, dropout=0.1)", {5, 8}),
            "attention: dropout=0.1 is not yet supported (attention runs with dropout 0)");
  EXPECT_EQ(spec_error("attention(2, bias=false)", {5, 8}),
            "attention has no option 'bias'; usage: attention(heads[, causal][, block=N][, fused])");
  EXPECT_EQ(spec_error("attention(2)", {8}),
            "attention needs a sequence input (tokens, features) but gets (8)");
  EXPECT_EQ(spec_error("attention(2)"),
            "attention needs a sequence input (tokens, features) but gets (3, 8, 8)");
  // In a model: one line, the item's position and text first.
  std::string model_error = "no error";
  try {
    Model m({"layernorm", "attention(3)", "linear(4)"}, {5, 8}, 0);
  } catch (const InputError& e) {
    model_error = e.what();
  }
  EXPECT_EQ(
      model_error,
      "model.layers(2) = 'attention(3)': attention: the features (8) are not a multiple of the heads (3)");
}

}  // namespace
}  // namespace ddp
