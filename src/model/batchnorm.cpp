#include "model/batchnorm.hpp"

#include <cmath>

#include "comm/check.hpp"
#include "comm/communicator.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"
#include "model/select.hpp"

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

// The planes' partial sums of channel_sums for B samples in `layout`, grown when
// more are needed.
void BatchNorm2d::reserve_partial(Layout layout, std::int64_t B) {
  const std::int64_t n = partial_doubles(layout, B, c_, hw_);
  if (static_cast<std::int64_t>(partial_.extent(0)) < n)
    partial_ =
        Kokkos::View<double*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "BatchNorm2d::partial"), n);
}

// Per channel, from the batch's sums: mean, 1/std, the affine parameters of this
// step, and the running statistics' update.
struct BatchNormStats {
  Kokkos::View<float*> mean, invstd, gamma, beta;
  const float *w, *b;
  float *rm, *rv, *nb;
  double n, unbias, momentum;
  float eps;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, double sum, double sum_sq) const {
    const double mu = sum / n, d = sum_sq / n - mu * mu, var = d > 0.0 ? d : 0.0;
    mean(c) = static_cast<float>(mu);
    invstd(c) = static_cast<float>(1.0 / sqrt(var + eps));
    gamma(c) = w[c];
    beta(c) = b[c];
    rm[c] = static_cast<float>((1.0 - momentum) * rm[c] + momentum * mu);
    rv[c] = static_cast<float>((1.0 - momentum) * rv[c] + momentum * var * unbias);
    if (c == 0) *nb += 1.0f;
  }
};

// Per channel, from backward's sums: the parameter gradients (this rank's) and,
// where dx follows, the means of dy and dy * xhat (over all ranks: only where the
// sums need no all-reduce first).
struct BatchNormBackwardThen {
  float *dw, *db;
  bool add;
  Kokkos::View<float*> mean_dy, mean_dy_xhat;  // empty: not here
  float inv_n;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, double sum_dy, double sum_dy_xhat) const {
    const float sb = static_cast<float>(sum_dy), sw = static_cast<float>(sum_dy_xhat);
    db[c] = add ? db[c] + sb : sb;
    dw[c] = add ? dw[c] + sw : sw;
    if (mean_dy.extent(0) > 0) {
      mean_dy(c) = sb * inv_n;
      mean_dy_xhat(c) = sw * inv_n;
    }
  }
};

// The gradient reaching the batch norm's output: dy, through the relu's mask where
// one is fused: y > 0, y the output (the default), or without y (DDP_BN_RELU_MASK=
// input) bn(x) > 0, the test forward_relu made on the value it rectified, taken again
// from x (BatchNormAffine: the same floats), so that backward reads x and dy and not
// the output as well: a third fewer bytes in its sums' pass and a quarter fewer in
// its pass over dx, but gamma and beta loaded too. Where a narrow output rounded a
// positive value to 0 (fp16 below 3e-8) the gradient then passes, as fp32's would.
template <bool Relu, class K = ChannelValues>
struct OutputGrad {
  BatchNormAffineOf<K> bn;  // read where a relu is fused
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x, float dy) const {
    if constexpr (Relu)
      return select_or_zero(relu_passes(bn(c, x)), dy);
    else
      return dy;
  }
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t, float, float dy, float y) const {
    return select_or_zero(relu_passes(y), dy);
  }
};
// dx from x and dy (and y, the mask's, where given) in batch norm's backward pass, in
// training: gamma invstd (g - mean(g) - xhat mean(g xhat)), g the output's gradient
// (OutputGrad; the means over all the channel's values); in eval: gamma invstd g.
// at8: for map_vectors (its constants 8 channels a load, model/elements.hpp).
template <bool Relu, class K = ChannelValues>
struct BatchNormInputGrad {
  OutputGrad<Relu, K> g;
  K mean_dy, mean_dy_xhat;
  template <class... Y>
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x, float dy, Y... y) const {
    const BatchNormAffineOf<K>& bn = g.bn;
    const float xhat = (x - bn.mean(c)) * bn.invstd(c);
    return bn.gamma(c) * bn.invstd(c) * (g(c, x, dy, y...) - mean_dy(c) - xhat * mean_dy_xhat(c));
  }
  KOKKOS_INLINE_FUNCTION BatchNormInputGrad<Relu, ChannelValues8> at8(std::int64_t c0) const {
    return {{g.bn.at8(c0)}, mean_dy.at8(c0), mean_dy_xhat.at8(c0)};
  }
  bool aligned() const { return g.bn.aligned() && mean_dy.aligned() && mean_dy_xhat.aligned(); }
};
template <bool Relu, class K = ChannelValues>
struct BatchNormEvalGrad {
  OutputGrad<Relu, K> g;
  template <class... Y>
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x, float dy, Y... y) const {
    return g(c, x, dy, y...) * g.bn.gamma(c) * g.bn.invstd(c);
  }
  KOKKOS_INLINE_FUNCTION BatchNormEvalGrad<Relu, ChannelValues8> at8(std::int64_t c0) const {
    return {{g.bn.at8(c0)}};
  }
  bool aligned() const { return g.bn.aligned(); }
};
// The terms of backward's sums: g and g xhat (at8: for plane_sums_nhwc_vectors).
template <bool Relu, class K = ChannelValues>
struct BatchNormGradTerm {
  OutputGrad<Relu, K> g;
  template <class... Y>
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t c, float x, float dy, Y... y) const {
    return double(g(c, x, dy, y...));
  }
  KOKKOS_INLINE_FUNCTION BatchNormGradTerm<Relu, ChannelValues8> at8(std::int64_t c0) const {
    return {{g.bn.at8(c0)}};
  }
  bool aligned() const { return g.bn.aligned(); }
};
template <bool Relu, class K = ChannelValues>
struct BatchNormGradXhatTerm {
  OutputGrad<Relu, K> g;
  template <class... Y>
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t c, float x, float dy, Y... y) const {
    return double(g(c, x, dy, y...)) * ((x - g.bn.mean(c)) * g.bn.invstd(c));
  }
  KOKKOS_INLINE_FUNCTION BatchNormGradXhatTerm<Relu, ChannelValues8> at8(std::int64_t c0) const {
    return {{g.bn.at8(c0)}};
  }
  bool aligned() const { return g.bn.aligned(); }
};

void BatchNorm2d::statistics(const Tensor& x, bool training) {
  library_forward_ = false;
  if (x.type == Precision::fp32)
    statistics_of<false>(x, training);
  else
    statistics_of<true>(x, training);
}

template <bool Narrow>
void BatchNorm2d::statistics_of(const Tensor& x, bool training) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  const auto xv = elements<Narrow>(x);
  auto mean = mean_, invstd = invstd_, gamma = gamma_, beta = beta_;
  const float eps = eps_;
  normalised_by_batch_ = training;
  const float *w = weight_, *b = bias_;
  if (!training) {
    const float *rm = running_mean_, *rv = running_var_;
    Kokkos::parallel_for(
        "BatchNorm2d::forward_running_stats", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
          mean(c) = rm[c];
          invstd(c) = 1.0f / sqrt(rv[c] + eps);
          gamma(c) = w[c];
          beta(c) = b[c];
        });
    return;
  }
  // Per-channel sums in double: E[x^2] - E[x]^2 stays accurate for any batch.
  auto sums = sums_;
  reserve_partial(x.layout, B);
  auto x1 = KOKKOS_LAMBDA(std::int64_t, float x) { return double(x); };
  auto x2 = KOKKOS_LAMBDA(std::int64_t, float x) {
    const double v = x;
    return v * v;
  };
  if (!comm_) {  // the statistics in the sums' own kernel
    count_ = B * hw;
    channel_sums("BatchNorm2d::forward_sums", "BatchNorm2d::forward_sums (rows)", x.layout, B, C, hw,
                 partial_, sums, x1, x2, batch_stats(), xv);
    return;
  }
  channel_sums("BatchNorm2d::forward_sums", "BatchNorm2d::forward_sums (rows)", x.layout, B, C, hw, partial_,
               sums, x1, x2, NoThen{}, xv);
  statistics_over_ranks(B * hw);
}

BatchNormStats BatchNorm2d::batch_stats() const {
  if (count_ < 2) throw InputError("batchnorm2d in training needs more than 1 value per channel");
  BatchNormStats st;
  st.mean = mean_;
  st.invstd = invstd_;
  st.gamma = gamma_;
  st.beta = beta_;
  st.w = weight_;
  st.b = bias_;
  st.rm = running_mean_;
  st.rv = running_var_;
  st.nb = batches_tracked_;
  st.n = double(count_);
  st.unbias = st.n / (st.n - 1.0);
  st.momentum = momentum_;
  st.eps = eps_;
  return st;
}

namespace {
// The kernels of the statistics from sums, as functions of their own: CUDA's extended
// lambdas may not live in private members.
void put_count(Kokkos::View<double*> sums, std::int64_t C, std::int64_t count) {
  Kokkos::parallel_for(
      "BatchNorm2d::count", Range(0, 1), KOKKOS_LAMBDA(int) { sums(2 * C) = double(count); });
}
void stats_from(const BatchNormStats& st, Kokkos::View<double*> sums, std::int64_t C) {
  Kokkos::parallel_for(
      "BatchNorm2d::forward_stats", Range(0, C),
      KOKKOS_LAMBDA(std::int64_t c) { st(c, sums(c), sums(C + c)); });
}
}  // namespace

// sums_ holds this rank's sums of x and x^2 (2C): with the count, all-reduced, then
// the statistics from them.
void BatchNorm2d::statistics_over_ranks(std::int64_t count) {
  put_count(sums_, c_, count);
  allreduce(sums_, 2 * c_ + 1);
  // The count over ranks only SyncBatchNorm needs to ask (a host wait); per rank it is known.
  Kokkos::deep_copy(sums_host_, sums_);
  count_ = static_cast<std::int64_t>(sums_host_(2 * c_));
  stats_from(batch_stats(), sums_, c_);
}

bool BatchNorm2d::library_runs(Layout layout, Precision type) const {
  return !comm_ && layout == Layout::nhwc && type != Precision::fp32 && library();
}

void BatchNorm2d::statistics_from_sums(const Tensor& x, const float* given) {
  library_forward_ = false;
  normalised_by_batch_ = true;
  const std::int64_t B = x.batch(), C = c_, count = B * hw_;
  if (!comm_) {
    count_ = count;
    const BatchNormStats st = batch_stats();
    Kokkos::parallel_for(
        "BatchNorm2d::stats_from_sums", Range(0, C),
        KOKKOS_LAMBDA(std::int64_t c) { st(c, double(given[c]), double(given[C + c])); });
    return;
  }
  auto sums = sums_;
  Kokkos::parallel_for(
      "BatchNorm2d::sums_from_conv", Range(0, 2 * C),
      KOKKOS_LAMBDA(std::int64_t i) { sums(i) = double(given[i]); });
  statistics_over_ranks(count);
}

void BatchNorm2d::forward_from_sums(const Tensor& x, const float* sums, Tensor& y) {
  statistics_from_sums(x, sums);
  write_normalised(x, y);
}

// x: (B, C, H, W) -> y: (B, C, H, W) = (x - mean) * invstd * gamma + beta (then
// rectified where a relu is fused), in x's layout (NCHW, or a convolution's
// blocked layout where the model keeps it) and type (narrow inside a residual
// block: model/elements.hpp; the arithmetic fp32 either way).
void BatchNorm2d::forward(const Tensor& x, Tensor& y, bool training) {
  if (training && library_runs(x)) return library_forward(x, nullptr, y);
  statistics(x, training);
  write_normalised(x, y);
}

void BatchNorm2d::write_normalised(const Tensor& x, Tensor& y) {
  resize(y, x.batch(), sample_, "BatchNorm2d::y", x.layout, x.type);
  if (x.type == Precision::fp32)
    normalise<false>(x, y);
  else
    normalise<true>(x, y);
}

// y = bn(x), or relu(bn(x)) with the relu fused (Relu); at8 as BatchNormInputGrad's.
template <bool Relu, class K = ChannelValues>
struct BatchNormForward {
  BatchNormAffineOf<K> bn;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x) const {
    const float v = bn(c, x);
    if constexpr (Relu)
      return select_or_zero(relu_passes(v), v);
    else
      return v;
  }
  KOKKOS_INLINE_FUNCTION BatchNormForward<Relu, ChannelValues8> at8(std::int64_t c0) const {
    return {bn.at8(c0)};
  }
  bool aligned() const { return bn.aligned(); }
};

template <bool Narrow>
void BatchNorm2d::normalise(const Tensor& x, Tensor& y) {
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  const auto xv = elements<Narrow>(x);
  const auto yv = elements<Narrow>(y);
  const BatchNormAffine bn = affine();
  // Padding channels: mean, invstd, gamma and beta are 0 there, so y is too.
  if (fused_relu_)
    map_elements("BatchNorm2d::forward_relu", x.layout, B, C, hw, BatchNormForward<true>{bn}, yv, xv);
  else
    map_elements("BatchNorm2d::forward", x.layout, B, C, hw, BatchNormForward<false>{bn}, yv, xv);
}

void BatchNorm2d::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (library_forward_) return library_backward(x, y, dy, dx, nullptr);
  const bool narrow = x.type != Precision::fp32, narrow_dy = dy.type != Precision::fp32;
  DDP_REQUIRE(narrow || !narrow_dy, "batchnorm2d: a narrow output gradient for an fp32 input");
  if (fused_relu_ && bn_relu_mask_from_input()) {  // the mask bn(x) > 0, y not read
    if (!narrow) return backward_passes<true, false, false>(x, dy, dx);
    if (!narrow_dy) return backward_passes<true, true, false>(x, dy, dx);
    return backward_passes<true, true, true>(x, dy, dx);
  }
  if (fused_relu_) {  // the mask y > 0
    if (!narrow) return backward_passes<true, false, false>(x, dy, dx, elements<false>(y));
    if (!narrow_dy) return backward_passes<true, true, false>(x, dy, dx, elements<true>(y));
    return backward_passes<true, true, true>(x, dy, dx, elements<true>(y));
  }
  if (!narrow) return backward_passes<false, false, false>(x, dy, dx);
  if (!narrow_dy) return backward_passes<false, true, false>(x, dy, dx);
  backward_passes<false, true, true>(x, dy, dx);
}

void BatchNorm2d::backward_unwritten(const Tensor& x, const Tensor& dy, Tensor& dx) {
  DDP_REQUIRE(fused_relu_ && !library_forward_,
              "batchnorm2d: an unwritten output of a fused relu's forward only");
  const bool narrow = x.type != Precision::fp32, narrow_dy = dy.type != Precision::fp32;
  DDP_REQUIRE(narrow || !narrow_dy, "batchnorm2d: a narrow output gradient for an fp32 input");
  if (!narrow) return backward_passes<true, false, false>(x, dy, dx);
  if (!narrow_dy) return backward_passes<true, true, false>(x, dy, dx);
  backward_passes<true, true, true>(x, dy, dx);
}

namespace {
// The means of dy and dy xhat (C each) from backward's sums over all ranks.
void means_from_sums(Kokkos::View<double*> sums, Kokkos::View<float*> mdy, Kokkos::View<float*> mdyx,
                     std::int64_t C, float inv_n) {
  Kokkos::parallel_for(
      "BatchNorm2d::backward_means", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        mdy(c) = static_cast<float>(sums(c)) * inv_n;
        mdyx(c) = static_cast<float>(sums(C + c)) * inv_n;
      });
}
}  // namespace

BatchNormBackwardThen BatchNorm2d::backward_then(bool means_here) const {
  return {dweight_,
          dbias_,
          !overwrite_gradients(),
          means_here ? mean_dy_ : Kokkos::View<float*>(),
          means_here ? mean_dy_xhat_ : Kokkos::View<float*>(),
          1.0f / static_cast<float>(count_)};
}

void BatchNorm2d::backward_means_over_ranks(float inv_n) {
  if (!comm_) return;  // the sums' pass wrote the means
  allreduce(sums_, 2 * c_);
  means_from_sums(sums_, mean_dy_, mean_dy_xhat_, c_, inv_n);
}

void BatchNorm2d::backward_from_sums(const Tensor& x, const Tensor& g, const float* sums, Tensor& dx) {
  DDP_REQUIRE(fused_relu_ && !library_forward_ && normalised_by_batch_,
              "batchnorm2d: backward from given sums after a fused relu's training forward only");
  const bool narrow = x.type != Precision::fp32, narrow_g = g.type != Precision::fp32;
  DDP_REQUIRE(narrow || !narrow_g, "batchnorm2d: a narrow output gradient for an fp32 input");
  if (!narrow) return backward_apply<false, false>(x, g, sums, dx);
  if (!narrow_g) return backward_apply<true, false>(x, g, sums, dx);
  backward_apply<true, true>(x, g, sums, dx);
}

// backward_passes' second pass, without a relu (g is masked already), after its sums
// from the given ones: sum g, then sum g xhat = invstd sum g (x - mean).
template <bool Narrow, bool NarrowG>
void BatchNorm2d::backward_apply(const Tensor& x, const Tensor& g, const float* given, Tensor& dx) {
  DDP_REQUIRE(g.layout == x.layout, "batchnorm2d output gradient in another layout than its input");
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  auto sums = sums_;
  auto invstd = invstd_;
  const BatchNormBackwardThen then = backward_then(!comm_ && needs_input_grad());
  // (the parameter gradients from this rank's sums; the means where no all-reduce comes first)
  Kokkos::parallel_for(
      "BatchNorm2d::backward_from_sums", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        sums(c) = double(given[c]);
        sums(C + c) = double(given[C + c]) * double(invstd(c));
        then(c, sums(c), sums(C + c));
      });
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "BatchNorm2d::dx", x.layout, x.type);
  auto mdy = mean_dy_, mdyx = mean_dy_xhat_;
  backward_means_over_ranks(then.inv_n);
  const OutputGrad<false> unmasked{affine()};
  map_elements("BatchNorm2d::backward", x.layout, B, C, hw,
               BatchNormInputGrad<false>{unmasked, {mdy.data()}, {mdyx.data()}}, elements<Narrow>(dx),
               elements<Narrow>(x), elements<NarrowG>(g));
}

void BatchNorm2d::scale_shift(float* to) const {
  const std::int64_t C = c_;
  const auto mean = mean_, invstd = invstd_, gamma = gamma_, beta = beta_;
  Kokkos::parallel_for(
      "BatchNorm2d::scale_shift", Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        const float scale = invstd(c) * gamma(c);
        to[c] = scale;
        to[C + c] = beta(c) - mean(c) * scale;
      });
}

// dy: (B, C, H, W) -> dgamma += (or =) sum dy xhat, dbeta += (or =) sum dy (this rank's samples);
// dx = gamma invstd (dy - sum(dy)/N - xhat sum(dy xhat)/N) with the sums over all N
// values of the channel (all ranks when synchronised); in eval dx = gamma invstd dy.
// dy and dx in x's layout, dx in x's type (dy fp32 or that); with a fused relu, dy
// is first masked by bn(x) > 0, or by y > 0 where y's elements are given (OutputGrad).
// Narrow: x (y) and dx narrow; NarrowDy: dy.
template <bool Relu, bool Narrow, bool NarrowDy, class... Y>
void BatchNorm2d::backward_passes(const Tensor& x, const Tensor& dy, Tensor& dx, Y... y) {
  DDP_REQUIRE(dy.layout == x.layout, "batchnorm2d output gradient in another layout than its input");
  const std::int64_t B = x.batch(), C = c_, hw = hw_;
  const auto xv = elements<Narrow>(x);
  const auto dyv = elements<NarrowDy>(dy);
  const OutputGrad<Relu> g{affine()};
  auto sums = sums_;
  const BatchNormBackwardThen then = backward_then(!comm_ && normalised_by_batch_ && needs_input_grad());
  reserve_partial(x.layout, B);
  const BatchNormGradTerm<Relu> dy1{g};
  const BatchNormGradXhatTerm<Relu> dy_xhat{g};
  if (comm_) {  // the parameter gradients from this rank's sums, before they are all-reduced
    channel_sums("BatchNorm2d::backward_sums", "BatchNorm2d::backward_sums (rows)", x.layout, B, C, hw,
                 partial_, sums, dy1, dy_xhat, NoThen{}, xv, dyv, y...);
    BatchNormBackwardThen grads = then;
    grads.mean_dy = grads.mean_dy_xhat = Kokkos::View<float*>();
    Kokkos::parallel_for(
        "BatchNorm2d::backward_param_grads", Range(0, C),
        KOKKOS_LAMBDA(std::int64_t c) { grads(c, sums(c), sums(C + c)); });
  } else {
    channel_sums("BatchNorm2d::backward_sums", "BatchNorm2d::backward_sums (rows)", x.layout, B, C, hw,
                 partial_, sums, dy1, dy_xhat, then, xv, dyv, y...);
  }
  if (!needs_input_grad()) return;
  resize(dx, B, sample_, "BatchNorm2d::dx", x.layout, x.type);
  const auto dxv = elements<Narrow>(dx);
  if (!normalised_by_batch_) {
    map_elements("BatchNorm2d::backward_eval", x.layout, B, C, hw, BatchNormEvalGrad<Relu>{g}, dxv, xv, dyv,
                 y...);
    return;
  }
  auto mdy = mean_dy_, mdyx = mean_dy_xhat_;
  backward_means_over_ranks(then.inv_n);
  map_elements("BatchNorm2d::backward", x.layout, B, C, hw,
               BatchNormInputGrad<Relu>{g, {mdy.data()}, {mdyx.data()}}, dxv, xv, dyv, y...);
}

namespace {
// num_batches_tracked += 1, on the device (a function of its own: CUDA's extended
// lambdas may not live in private members).
void count_batch(float* batches_tracked) {
  Kokkos::parallel_for(
      "BatchNorm2d::batches_tracked", Range(0, 1), KOKKOS_LAMBDA(std::int64_t) { *batches_tracked += 1.0f; });
}
}  // namespace

BatchNormKernels* BatchNorm2d::library() const {
  if (library_set_) return library_;
  ComputeBackend& backend = compute_backend();
  return backend.batch_norm_in_library() ? backend.batch_norm() : nullptr;
}

bool BatchNorm2d::library_runs(const Tensor& x) const { return library_runs(x.layout, x.type); }

BatchNormPass BatchNorm2d::library_pass(std::int64_t B, Precision type, bool add) const {
  BatchNormPass p;
  p.B = B;
  p.C = c_;
  p.hw = hw_;
  p.type = type;
  p.relu = fused_relu_ || add;
  p.add = add;
  return p;
}

bool BatchNorm2d::library_would_run(Layout layout, Precision type) const {
  return !sync_ && layout == Layout::nhwc && type != Precision::fp32 && library();
}

std::int64_t BatchNorm2d::library_reserve_floats(std::int64_t batch, Layout layout, Precision type,
                                                 bool add) const {
  if (!library_would_run(layout, type)) return 0;
  return std::int64_t(library()->reserve_bytes(library_pass(batch, type, add)) / sizeof(float));
}

// The library's kernels write y, the statistics (mean_, invstd_: what backward reads)
// and the running update; the batch count is this layer's own. affine()'s gamma and
// beta are not written: nothing reads them after a library forward.
void BatchNorm2d::library_forward(const Tensor& x, const Tensor* z, Tensor& y) {
  const std::int64_t B = x.batch();
  count_ = B * hw_;
  if (count_ < 2) throw InputError("batchnorm2d in training needs more than 1 value per channel");
  resize(y, B, sample_, "BatchNorm2d::y", x.layout, x.type);
  BatchNormKernels& kernels = *library();
  const BatchNormPass p = library_pass(B, x.type, z != nullptr);
  const std::size_t bytes = kernels.reserve_bytes(p);
  reserve_used_ = bytes;
  if (reserve_.extent(0) < bytes)
    reserve_ =
        Kokkos::View<char*>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "BatchNorm2d::reserve"), bytes);
  kernels.forward_training(p, x.data.data(), z ? z->data.data() : nullptr, y.data.data(), weight_, bias_,
                           running_mean_, running_var_, momentum_, eps_, mean_.data(), invstd_.data(),
                           bytes ? reserve_.data() : nullptr, bytes);
  count_batch(batches_tracked_);
  normalised_by_batch_ = true;
  library_forward_ = true;
  library_added_ = z != nullptr;
}

// dx is written whether needed or not (the library writes it; a batch norm is not
// a model's first layer). A dy of another type is cast to x's first, as PyTorch's
// AMP hands it.
void BatchNorm2d::library_backward(const Tensor& x, const Tensor& y, const Tensor& dy_given, Tensor& dx,
                                   Tensor* dz) {
  DDP_REQUIRE(dy_given.layout == x.layout, "batchnorm2d output gradient in another layout than its input");
  DDP_REQUIRE((dz != nullptr) == library_added_,
              "batchnorm2d: a backward " << (dz ? "with" : "without") << " the shortcut's gradient after a "
                                         << "forward " << (library_added_ ? "with" : "without")
                                         << " the shortcut");
  const Tensor* dy = &dy_given;
  if (dy_given.type != x.type) {
    convert_type(dy_given, dy_cast_, x.type, "BatchNorm2d::dy");
    dy = &dy_cast_;
  }
  resize(dx, x.batch(), sample_, "BatchNorm2d::dx", x.layout, x.type);
  const BatchNormPass p = library_pass(x.batch(), x.type, dz != nullptr);
  if (dz)
    DDP_REQUIRE(dz->layout == x.layout && dz->type == x.type && dz->storage_numel() == x.storage_numel(),
                "batchnorm2d: the shortcut's gradient is not shaped like its input");
  library()->backward(p, x.data.data(), y.data.data(), dy->data.data(), dx.data.data(),
                      dz ? dz->data.data() : nullptr, weight_, bias_, dweight_, dbias_,
                      !overwrite_gradients(), eps_, mean_.data(), invstd_.data(),
                      reserve_used_ ? reserve_.data() : nullptr, reserve_used_);
}

void BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& z, Tensor& y) {
  DDP_REQUIRE(
      library_runs(x) && z.layout == x.layout && z.type == x.type && z.storage_numel() == x.storage_numel(),
      "batchnorm2d: a library forward with a shortcut it cannot take");
  library_forward(x, &z, y);
}

void BatchNorm2d::backward_add_relu(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                                    Tensor& dz) {
  DDP_REQUIRE(library_forward_, "batchnorm2d: the shortcut's gradient after a forward outside the library");
  library_backward(x, y, dy, dx, &dz);
}

}  // namespace ddp
