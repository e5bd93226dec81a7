#include "model/batchnorm.hpp"

#include <cmath>

#include "comm/check.hpp"
#include "comm/communicator.hpp"
#include "model/planes.hpp"

namespace ddp {

namespace {
#if KOKKOS_VERSION >= 30700
using Kokkos::sqrt;
#else
using Kokkos::Experimental::sqrt;
#endif
}  // namespace

Shape BatchNorm2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("batchnorm2d needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  c_ = in_sample[0];
  hw_ = in_sample[1] * in_sample[2];
  sample_ = in_sample;
  sums_ = Kokkos::View<double*>("BatchNorm2d::sums", 2 * c_ + 1);
  sums_host_ = Kokkos::create_mirror_view(sums_);
  // Padded to a block with zeros: a blocked layout's padding channels stay zero.
  const std::int64_t cp = padded_channels(c_);
  mean_ = Kokkos::View<float*>("BatchNorm2d::mean", cp);
  invstd_ = Kokkos::View<float*>("BatchNorm2d::invstd", cp);
  gamma_ = Kokkos::View<float*>("BatchNorm2d::gamma", cp);
  beta_ = Kokkos::View<float*>("BatchNorm2d::beta", cp);
  mean_dy_ = Kokkos::View<float*>("BatchNorm2d::mean_dy", cp);
  mean_dy_xhat_ = Kokkos::View<float*>("BatchNorm2d::mean_dy_xhat", cp);
  return in_sample;
}

std::vector<Layer::ParamSpec> BatchNorm2d::parameter_specs() const {
  return {{"weight", {c_}}, {"bias", {c_}}};
}

void BatchNorm2d::bind(float* params, float* grads) {
  weight_ = params;
  bias_ = params + c_;
  dweight_ = grads;
  dbias_ = grads + c_;
}

std::vector<Layer::ParamSpec> BatchNorm2d::buffer_specs() const {
  return {{"running_mean", {c_}}, {"running_var", {c_}}, {"num_batches_tracked", {}}};
}

void BatchNorm2d::bind_buffers(float* buffers) {
  running_mean_ = buffers;
  running_var_ = buffers + c_;
  batches_tracked_ = buffers + 2 * c_;
}

// PyTorch's reset: gamma 1 (0 with set_zero_gamma), beta 0, running mean 0, running
// var 1, no batches yet.
void BatchNorm2d::init(Rng& /*rng*/) {
  const std::int64_t C = c_;
  const float gamma = zero_gamma_ ? 0.0f : 1.0f;
  float *w = weight_, *b = bias_, *rm = running_mean_, *rv = running_var_, *nb = batches_tracked_;
  Kokkos::parallel_for(
      "BatchNorm2d::init", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        w[c] = gamma;
        b[c] = 0.0f;
        rm[c] = 0.0f;
        rv[c] = 1.0f;
        if (c == 0) *nb = 0.0f;
      });
}

// On the sums where they are (device memory on a GPU): no copy to the host and back.
void BatchNorm2d::allreduce(Kokkos::View<double*> sums, std::size_t n) {
  if (comm_) comm_->allreduce_sum(sums.data(), n);
}

// The planes' partial sums for B samples: 2 B Cp doubles, grown when B is larger.
void BatchNorm2d::reserve_partial(std::int64_t B) {
  const std::int64_t n = 2 * B * padded_channels(c_);
  if (static_cast<std::int64_t>(partial_.extent(0)) < n)
    partial_ =
        Kokkos::View<double*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "BatchNorm2d::partial"), n);
}

// x: (B, C, H, W) -> y: (B, C, H, W) = (x - mean) * invstd * gamma + beta, in x's
// layout (NCHW, or a convolution's blocked layout where the model keeps it).
void BatchNorm2d::forward(const Tensor& x, Tensor& y, bool training) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  resize(y, B, sample_, "BatchNorm2d::y", x.layout);
  ConstView1 xv = x.data;
  View1 yv = y.data;
  auto mean = mean_, invstd = invstd_, gamma = gamma_, beta = beta_;
  const float eps = eps_;
  normalised_by_batch_ = training;
  const float *w = weight_, *b = bias_;
  if (training) {
    // Per-channel sums in double: E[x^2] - E[x]^2 stays accurate for any batch.
    auto sums = sums_;
    reserve_partial(B);
    channel_sums(
        "BatchNorm2d::forward_sums", x.layout, B, C, hw, partial_, sums,
        KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(xv(e)); },
        KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(xv(e)) * xv(e); });
    Kokkos::parallel_for(
        "BatchNorm2d::count", Range(0, 1), KOKKOS_LAMBDA(int) { sums(2 * C) = double(B * hw); });
    allreduce(sums_, 2 * C + 1);
    // The count over ranks only SyncBatchNorm needs to ask (a host wait); per rank it is known.
    if (comm_) {
      Kokkos::deep_copy(sums_host_, sums_);
      count_ = static_cast<std::int64_t>(sums_host_(2 * C));
    } else {
      count_ = B * hw;
    }
    if (count_ < 2) throw InputError("batchnorm2d in training needs more than 1 value per channel");
    const double n = double(count_), unbias = n / (n - 1.0), m = momentum_;
    float *rm = running_mean_, *rv = running_var_, *nb = batches_tracked_;
    Kokkos::parallel_for(
        "BatchNorm2d::forward_stats", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
          const double mu = sums(c) / n, d = sums(C + c) / n - mu * mu, var = d > 0.0 ? d : 0.0;
          mean(c) = static_cast<float>(mu);
          invstd(c) = static_cast<float>(1.0 / sqrt(var + eps));
          gamma(c) = w[c];
          beta(c) = b[c];
          rm[c] = static_cast<float>((1.0 - m) * rm[c] + m * mu);
          rv[c] = static_cast<float>((1.0 - m) * rv[c] + m * var * unbias);
          if (c == 0) *nb += 1.0f;
        });
  } else {
    const float *rm = running_mean_, *rv = running_var_;
    Kokkos::parallel_for(
        "BatchNorm2d::forward_running_stats", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
          mean(c) = rm[c];
          invstd(c) = 1.0f / sqrt(rv[c] + eps);
          gamma(c) = w[c];
          beta(c) = b[c];
        });
  }
  // Padding channels: mean, invstd, gamma and beta are 0 there, so y is too.
  for_each_element(
      "BatchNorm2d::forward", x.layout, B, C, hw,
      KOKKOS_LAMBDA(std::int64_t, std::int64_t c, std::int64_t, std::int64_t e) {
        yv(e) = (xv(e) - mean(c)) * invstd(c) * gamma(c) + beta(c);
      });
}

// dy: (B, C, H, W) -> dgamma += (or =) sum dy xhat, dbeta += (or =) sum dy (this rank's samples);
// dx = gamma invstd (dy - sum(dy)/N - xhat sum(dy xhat)/N) with the sums over all N
// values of the channel (all ranks when synchronised); in eval dx = gamma invstd dy.
// dy and dx in x's layout.
void BatchNorm2d::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  DDP_REQUIRE(dy.layout == x.layout, "batchnorm2d output gradient in another layout than its input");
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  ConstView1 xv = x.data, dyv = dy.data;
  auto mean = mean_, invstd = invstd_, gamma = gamma_;
  auto sums = sums_;
  float *dw = dweight_, *db = dbias_;
  const bool add = !overwrite_gradients();
  reserve_partial(B);
  channel_sums(
      "BatchNorm2d::backward_sums", x.layout, B, C, hw, partial_, sums,
      KOKKOS_LAMBDA(std::int64_t, std::int64_t e) { return double(dyv(e)); },
      KOKKOS_LAMBDA(std::int64_t c, std::int64_t e) {
        return double(dyv(e)) * ((xv(e) - mean(c)) * invstd(c));
      });
  Kokkos::parallel_for(
      "BatchNorm2d::backward_param_grads", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        const float sb = static_cast<float>(sums(c)), sw = static_cast<float>(sums(C + c));
        db[c] = add ? db[c] + sb : sb;
        dw[c] = add ? dw[c] + sw : sw;
      });
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "BatchNorm2d::dx", x.layout);
  View1 dxv = dx.data;
  if (!normalised_by_batch_) {
    for_each_element(
        "BatchNorm2d::backward_eval", x.layout, B, C, hw,
        KOKKOS_LAMBDA(std::int64_t, std::int64_t c, std::int64_t, std::int64_t e) {
          dxv(e) = dyv(e) * gamma(c) * invstd(c);
        });
    return;
  }
  allreduce(sums_, 2 * C);
  const float inv_n = 1.0f / static_cast<float>(count_);
  auto mdy = mean_dy_, mdyx = mean_dy_xhat_;
  Kokkos::parallel_for(
      "BatchNorm2d::backward_means", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        mdy(c) = static_cast<float>(sums(c)) * inv_n;
        mdyx(c) = static_cast<float>(sums(C + c)) * inv_n;
      });
  for_each_element(
      "BatchNorm2d::backward", x.layout, B, C, hw,
      KOKKOS_LAMBDA(std::int64_t, std::int64_t c, std::int64_t, std::int64_t e) {
        const float xhat = (xv(e) - mean(c)) * invstd(c);
        dxv(e) = gamma(c) * invstd(c) * (dyv(e) - mdy(c) - xhat * mdyx(c));
      });
}

}  // namespace ddp
