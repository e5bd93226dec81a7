#pragma once
// Helpers shared by the model and layer tests: host <-> View copies, random inputs,
// and the check of a layer's gradients against central finite differences.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <vector>

#include "model/layer.hpp"
#include "model/tensor.hpp"

namespace ddp::test {

inline std::vector<float> to_host(const View1& v, std::int64_t n) {
  auto v_host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(v_host, v);
  return std::vector<float>(v_host.data(), v_host.data() + n);
}

// Overwrite the first values.size() elements of v.
inline void from_host(const View1& v, const std::vector<float>& values) {
  auto v_host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(v_host, v);
  std::copy(values.begin(), values.end(), v_host.data());
  Kokkos::deep_copy(v, v_host);
}

inline Tensor make_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t{View1("test::tensor", shape_numel(shape)), shape};
  from_host(t.data, values);
  return t;
}

// n values U(lo, hi), each at least min_abs away from 0 (keeps relu off its kink).
inline std::vector<float> random_values(std::int64_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f,
                                        float min_abs = 0.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) do
      x = dist(gen);
    while (std::fabs(x) < min_abs);
  return v;
}

// The largest |a - b| over the largest |b|: a relative error that one small element
// cannot blow up.
inline double max_relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

// |a - b| / |b| in the Euclidean norm over all elements: a few elements far off
// (a relu flipped by a rounding) move it little.
inline double norm_relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

// Elements with |analytic - numeric| > rtol * max(|analytic|, |numeric|) + atol;
// the first few are printed.
inline std::size_t count_off(const std::vector<float>& analytic, const std::vector<double>& numeric,
                             const char* what, double rtol, double atol) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    double a = analytic[i], n = numeric[i];
    if (std::fabs(a - n) > rtol * std::max(std::fabs(a), std::fabs(n)) + atol && bad++ < 5)
      std::cout << "  " << what << "[" << i << "]: analytic " << a << " numeric " << n << "\n";
  }
  return bad;
}

inline void expect_close(const std::vector<float>& analytic, const std::vector<double>& numeric,
                         const char* what, double rtol = 1e-2, double atol = 1e-3) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  EXPECT_EQ(count_off(analytic, numeric, what, rtol, atol), 0u) << what << ": elements off (printed above)";
}

// Central differences of f (a scalar function of the n floats in v, on the device)
// with respect to each of those floats.
template <class F>
std::vector<double> numeric_gradient(const View1& v, std::int64_t n, double eps, F f) {
  std::vector<float> base = to_host(v, n);
  std::vector<double> g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<float> p = base;
    p[i] = base[i] + static_cast<float>(eps);
    from_host(v, p);
    double up = f();
    p[i] = base[i] - static_cast<float>(eps);
    from_host(v, p);
    double down = f();
    g[i] = (up - down) / (2 * eps);
  }
  from_host(v, base);
  return g;
}

struct GradCheck {
  bool training = true;
  double eps = 1e-2, rtol = 1e-2, atol = 1e-3;
  std::function<void()> before_forward = [] {};  // before every forward (dropout fixes its mask)
  std::uint32_t w_seed = 12;                     // the weights w of L = sum(w * y)
  double max_off = 0.0;  // fraction of elements allowed to miss (relu kinks a step can straddle)
};

// A layer's backward at input x against central differences of L = sum_i w_i y_i
// (in double, w random): the input gradient, and the n parameters whose values and
// gradients are `params` and `grads` (n may be 0).
inline void check_layer_gradients(Layer& layer, Tensor& x, const View1& params, const View1& grads,
                                  std::int64_t n, const GradCheck& o = {}) {
  Tensor y, dx;
  o.before_forward();
  layer.forward(x, y, o.training);
  const std::vector<float> w = random_values(y.numel(), o.w_seed);
  Tensor dy = make_tensor(y.shape, w);
  auto loss = [&]() {
    Tensor yy;
    o.before_forward();
    layer.forward(x, yy, o.training);
    std::vector<float> yh = to_host(yy.data, yy.numel());
    double s = 0;
    for (std::size_t i = 0; i < yh.size(); ++i) s += double(w[i]) * yh[i];
    return s;
  };
  layer.backward(x, y, dy, dx);
  ASSERT_EQ(dx.shape, x.shape);
  const std::vector<float> dx_host = to_host(dx.data, dx.numel()), dp_host = to_host(grads, n);
  const std::size_t bad_dx =
      count_off(dx_host, numeric_gradient(x.data, x.numel(), o.eps, loss), "dx", o.rtol, o.atol);
  EXPECT_LE(bad_dx, std::size_t(o.max_off * double(dx_host.size()))) << "dx elements off (printed above)";
  if (n == 0) return;
  const std::size_t bad_dp =
      count_off(dp_host, numeric_gradient(params, n, o.eps, loss), "dparams", o.rtol, o.atol);
  EXPECT_LE(bad_dp, std::size_t(o.max_off * double(n))) << "dparams elements off (printed above)";
}

}  // namespace ddp::test
