#pragma once
// Helpers shared by the model tests: host <-> View copies, random inputs, and the
// comparison of an analytic gradient with central finite differences.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

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

// |analytic - numeric| <= rtol * max(|analytic|, |numeric|) + atol for every element.
inline void expect_close(const std::vector<float>& analytic, const std::vector<double>& numeric,
                         const char* what, double rtol = 1e-2, double atol = 1e-3) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    double a = analytic[i], n = numeric[i];
    EXPECT_LE(std::fabs(a - n), rtol * std::max(std::fabs(a), std::fabs(n)) + atol)
        << what << "[" << i << "]: analytic " << a << " numeric " << n;
  }
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

}  // namespace ddp::test
