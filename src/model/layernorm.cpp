#include "model/layernorm.hpp"

#include <cmath>

#include "comm/check.hpp"
#include "model/column_sums.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"  // for_each_team_thread

namespace ddp {

namespace {
#if KOKKOS_VERSION >= 30700
using Kokkos::sqrt;
#else
using Kokkos::Experimental::sqrt;
#endif

// (x - hi) - lo: x minus a mean held as two floats. Where a row sits far from 0
// against its spread (x = 10 +- 0.1), the float mean alone is off by up to 6e-7, 6e-6
// of the spread, in every normalised value; x - hi is exact there (Sterbenz), and lo
// takes the rest.
KOKKOS_INLINE_FUNCTION float centred(float x, float hi, float lo) { return (x - hi) - lo; }

}  // namespace

Shape LayerNorm::output_shape(const Shape& in_sample) {
  // An image's last dimension is its width: nn.LayerNorm(W) there is almost never meant.
  if (in_sample.size() != 1 && in_sample.size() != 2)
    throw InputError("layernorm needs a flat (features) or sequence (tokens, features) input but gets " +
                     shape_str(in_sample));
  d_ = in_sample.back();
  sample_ = in_sample;
  return in_sample;
}

std::vector<Layer::ParamSpec> LayerNorm::parameter_specs() const {
  return {{"weight", {d_}}, {"bias", {d_}}};
}

void LayerNorm::bind(float* params, float* grads) {
  weight_ = params;
  bias_ = params + d_;
  dweight_ = grads;
  dbias_ = grads + d_;
}

// PyTorch's reset_parameters: weight 1, bias 0.
void LayerNorm::init(Rng& /*rng*/) {
  float *w = weight_, *b = bias_;
  Kokkos::parallel_for(
      "LayerNorm::init", Range(0, d_), KOKKOS_LAMBDA(std::int64_t j) {
        w[j] = 1.0f;
        b[j] = 0.0f;
      });
}

// The rows' mean (as hi + lo) and 1 / std.
std::int64_t LayerNorm::kept_floats(std::int64_t batch) const {
  return 3 * batch * shape_numel(sample_) / d_;
}

// x: (B, [T,] d) -> y: (B, [T,] d). Per row r of d values: mean(r), rstd(r) =
// 1 / sqrt(var + eps) with the biased variance, both from sums in double (the
// variance as the mean of squared deviations: no cancellation); y = (x - mean) rstd
// weight + bias, x - mean by centred(). A team thread per row, its vector lanes over
// the row (a GPU warp reads it coalesced); the row's three passes hit the cache after
// the first. The row sums by lane_sum: in a fixed order, vectorised on the host.
void LayerNorm::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_nchw(x, Precision::fp32, "layernorm", "the input");
  const std::int64_t rows = x.numel() / d_;
  if (static_cast<std::int64_t>(mean_.extent(0)) < rows) {  // grown only: a smaller batch uses a prefix
    mean_ = View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "LayerNorm::mean"), rows);
    mean_lo_ = View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "LayerNorm::mean_lo"), rows);
    rstd_ = View1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "LayerNorm::rstd"), rows);
  }
  resize(y, x.batch(), sample_, "LayerNorm::y", Layout::nchw, out_type_);
  if (out_type_ == Precision::fp32)
    forward_rows<false>(x, y);
  else
    forward_rows<true>(x, y);
}

template <bool Narrow>
void LayerNorm::forward_rows(const Tensor& x, Tensor& y) {
  const std::int64_t d = d_, rows = x.numel() / d;
  const float* xp = x.data.data();
  const auto ye = elements<Narrow>(y);
  const float *w = weight_, *b = bias_;
  View1 mean = mean_, mean_lo = mean_lo_, rstd = rstd_;
  const double eps = eps_;
  for_each_team_thread(
      "LayerNorm::forward", rows, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        const float* xr = xp + r * d;
        const std::int64_t y0 = r * d;
        const double mu = lane_sum(team, d, [&](std::int64_t j) { return double(xr[j]); }) / double(d);
        const double sq = lane_sum(team, d, [&](std::int64_t j) {
          const double c = xr[j] - mu;
          return c * c;
        });
        const float hi = static_cast<float>(mu), lo = static_cast<float>(mu - double(hi)),
                    rs = static_cast<float>(1.0 / sqrt(sq / double(d) + eps));
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, d), [&](std::int64_t j) {
          ye.set(y0 + j, centred(xr[j], hi, lo) * rs * w[j] + b[j]);
        });
        Kokkos::single(Kokkos::PerThread(team), [&] {
          mean(r) = hi;
          mean_lo(r) = lo;
          rstd(r) = rs;
        });
      });
}

// dy: (B, [T,] d) -> with xhat = (x - mean) rstd and g = dy weight per row:
// dx = rstd (g - mean_j(g) - xhat mean_j(g xhat)) (the row's means over its d values),
// dweight += (or =) sum over rows of dy xhat, dbias += (or =) sum over rows of dy.
// The row sums in double as forward's; the parameter sums in double by column_sums:
// the same bits on any device and thread count for the same rows.
void LayerNorm::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_nchw(dy, out_type_, "layernorm", "the output gradient");
  if (out_type_ == Precision::fp32)
    backward_rows<false, false>(x, dy, nullptr, dx);
  else
    backward_rows<true, false>(x, dy, nullptr, dx);
}

void LayerNorm::backward_adding(const Tensor& x, const Tensor& dy, const Tensor& residual, Tensor& dx) {
  require_nchw(dy, out_type_, "layernorm", "the output gradient");
  require_nchw(residual, Precision::fp32, "layernorm", "the residual added to dx");
  DDP_REQUIRE(residual.numel() == x.numel() && residual.data.data() != dx.data.data(),
              "layernorm: the residual added to dx is not x's shape, or is dx itself");
  if (out_type_ == Precision::fp32)
    backward_rows<false, true>(x, dy, residual.data.data(), dx);
  else
    backward_rows<true, true>(x, dy, residual.data.data(), dx);
}

template <bool Narrow, bool Adding>
void LayerNorm::backward_rows(const Tensor& x, const Tensor& dy, const float* residual, Tensor& dx) {
  const std::int64_t d = d_, rows = x.numel() / d;
  const float *xp = x.data.data(), *w = weight_;
  const auto dye = elements<Narrow>(dy);
  const View1 mean = mean_, mean_lo = mean_lo_, rstd = rstd_;

  float* const grads[2] = {dweight_, dbias_};
  column_sums<2>(
      "LayerNorm::backward_param_sums", "LayerNorm::backward_param_grads", rows, d, partial_,
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
        const float g = dye(r * d + j), xhat = centred(xp[r * d + j], mean(r), mean_lo(r)) * rstd(r);
        return Kokkos::Array<double, 2>{double(g) * xhat, double(g)};
      },
      grads, !overwrite_gradients());

  if (!needs_input_grad()) return;
  resize(dx, x.batch(), sample_, "LayerNorm::dx");
  float* dxp = dx.data.data();
  for_each_team_thread(
      "LayerNorm::backward", rows, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t r) {
        const float* xr = xp + r * d;
        const std::int64_t dy0 = r * d;
        float* dxr = dxp + r * d;
        const float* res = residual + (Adding ? r * d : 0);
        const float hi = mean(r), lo = mean_lo(r), rs = rstd(r);
        const double sg = lane_sum(team, d, [&](std::int64_t j) { return double(dye(dy0 + j) * w[j]); }),
                     sgx = lane_sum(team, d, [&](std::int64_t j) {
                       return double(dye(dy0 + j) * w[j]) * (centred(xr[j], hi, lo) * rs);
                     });
        const float mg = static_cast<float>(sg / double(d)), mgx = static_cast<float>(sgx / double(d));
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, d), [&](std::int64_t j) {
          const float xhat = centred(xr[j], hi, lo) * rs, g = rs * (dye(dy0 + j) * w[j] - mg - xhat * mgx);
          if constexpr (Adding)
            dxr[j] = res[j] + g;
          else
            dxr[j] = g;
        });
      });
}

}  // namespace ddp
