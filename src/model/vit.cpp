#include "model/vit.hpp"

#include "comm/check.hpp"

namespace ddp {

namespace {

void require_plain(const Tensor& t, const char* layer, const char* what) {
  DDP_REQUIRE(t.type == Precision::fp32 && t.layout == Layout::nchw,
              layer << ": " << what << " is " << precision_name(t.type) << " in " << layout_name(t.layout)
                    << ", not fp32 in nchw");
}

// A sequence (T, d), or the layer's one line saying what it got.
void require_sequence(const Shape& s, const char* layer) {
  if (s.size() != 2)
    throw InputError(std::string(layer) + " needs a sequence (tokens, features) but gets " + shape_str(s) +
                     (s.size() == 3 ? ": an image becomes tokens through patch_embed(p, d)" : ""));
}
}  // namespace

PatchEmbed::PatchEmbed(std::int64_t patch, std::int64_t d)
    : patch_(patch), d_(d), conv_(std::make_unique<Conv2d>(d, patch, patch, 0, true)) {}

Shape PatchEmbed::output_shape(const Shape& in_sample) {
  const std::string me = "patch_embed(" + std::to_string(patch_) + ", " + std::to_string(d_) + ")";
  if (in_sample.size() != 3)
    throw InputError(me + " needs an image (channels, height, width) but gets " + shape_str(in_sample));
  if (in_sample[1] % patch_ != 0 || in_sample[2] % patch_ != 0)
    throw InputError(me + ": the image " + shape_str(in_sample) + " is not a whole number of " +
                     std::to_string(patch_) + " x " + std::to_string(patch_) +
                     " patches (height and width must be multiples of " + std::to_string(patch_) +
                     ": data.image_size, or another patch size)");
  const Shape c = conv_->output_shape(in_sample);  // (d, H/p, W/p)
  T_ = c[1] * c[2];
  sample_ = {T_, d_};
  return sample_;
}

void PatchEmbed::set_precision(Precision p) {
  Layer::set_precision(p);
  conv_->set_precision(p);
}

void PatchEmbed::set_overwrite_gradients(bool on) {
  Layer::set_overwrite_gradients(on);
  conv_->set_overwrite_gradients(on);
}

// The convolution's output and its gradient, besides what the convolution keeps.
std::int64_t PatchEmbed::kept_floats(std::int64_t batch) const {
  return 2 * batch * T_ * d_ + conv_->kept_floats(batch, needs_input_grad(), false);
}

void PatchEmbed::scratch_floats(std::int64_t batch, SlotFloats& most) const {
  conv_->scratch_floats(batch, most);
}

// x (B, C, H, W) -> c (B, d, T) by the convolution -> y (B, T, d): y(b, t, j) = c(b, j, t).
void PatchEmbed::forward(const Tensor& x, Tensor& y, bool training) {
  conv_->forward(x, c_, training);
  require_plain(c_, "patch_embed", "the convolution's output");
  const std::int64_t B = x.batch(), T = T_, d = d_;
  resize(y, B, sample_, "PatchEmbed::y");
  ConstView1 cv = c_.data;
  View1 yv = y.data;
  Kokkos::parallel_for(
      "PatchEmbed::forward_tokens", rows_range(B, T, d),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t t, std::int64_t j) {
        yv((b * T + t) * d + j) = cv((b * d + j) * T + t);
      });
}

// dc(b, j, t) = dy(b, t, j), then the convolution's backward.
void PatchEmbed::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_plain(dy, "patch_embed", "the output gradient");
  const std::int64_t B = x.batch(), T = T_, d = d_;
  resize_like(dc_, c_, "PatchEmbed::dc");
  ConstView1 g = dy.data;
  View1 dcv = dc_.data;
  Kokkos::parallel_for(
      "PatchEmbed::backward_tokens", rows_range(B, d, T),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t j, std::int64_t t) {
        dcv((b * d + j) * T + t) = g((b * T + t) * d + j);
      });
  conv_->set_needs_input_grad(needs_input_grad());
  conv_->backward(x, c_, dc_, dx);
}

Shape ClassToken::output_shape(const Shape& in_sample) {
  require_sequence(in_sample, "class_token");
  T_ = in_sample[0];
  d_ = in_sample[1];
  in_sample_ = in_sample;
  sample_ = {T_ + 1, d_};
  return sample_;
}

void ClassToken::bind(float* params, float* grads) {
  weight_ = params;
  dweight_ = grads;
}

void ClassToken::init(Rng& /*rng*/) {
  float* w = weight_;
  Kokkos::parallel_for(
      "ClassToken::init", Range(0, d_), KOKKOS_LAMBDA(std::int64_t j) { w[j] = 0.0f; });
}

// y(b, 0, :) = the token; y(b, t + 1, :) = x(b, t, :)
void ClassToken::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_plain(x, "class_token", "the input");
  const std::int64_t B = x.batch(), T = T_, d = d_;
  resize(y, B, sample_, "ClassToken::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const float* w = weight_;
  Kokkos::parallel_for(
      "ClassToken::forward", rows_range(B, T + 1, d),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t t, std::int64_t j) {
        yv((b * (T + 1) + t) * d + j) = t == 0 ? w[j] : xv((b * T + t - 1) * d + j);
      });
}

// dweight (+)= sum over b of dy(b, 0, :), in batch order; dx(b, t, :) = dy(b, t + 1, :).
void ClassToken::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_plain(dy, "class_token", "the output gradient");
  const std::int64_t B = x.batch(), T = T_, d = d_;
  ConstView1 g = dy.data;
  float* dw = dweight_;
  const bool add = !overwrite_gradients();
  Kokkos::parallel_for(
      "ClassToken::backward_param_grads", Range(0, d), KOKKOS_LAMBDA(std::int64_t j) {
        float s = 0.0f;
        for (std::int64_t b = 0; b < B; ++b) s += g(b * (T + 1) * d + j);
        dw[j] = add ? dw[j] + s : s;
      });
  if (!needs_input_grad()) return;
  resize(dx, B, in_sample_, "ClassToken::dx");
  View1 dxv = dx.data;
  Kokkos::parallel_for(
      "ClassToken::backward_dx", rows_range(B, T, d),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t t, std::int64_t j) {
        dxv((b * T + t) * d + j) = g((b * (T + 1) + t + 1) * d + j);
      });
}

Shape TokenPool::output_shape(const Shape& in_sample) {
  require_sequence(in_sample, "token_pool");
  T_ = in_sample[0];
  d_ = in_sample[1];
  in_sample_ = in_sample;
  sample_ = {d_};
  return sample_;
}

// y(b, :) = x(b, 0, :), or the mean over t of x(b, t, :) (summed in token order).
void TokenPool::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  require_plain(x, "token_pool", "the input");
  const std::int64_t B = x.batch(), T = T_, d = d_;
  resize(y, B, sample_, "TokenPool::y");
  ConstView1 xv = x.data;
  View1 yv = y.data;
  const bool mean = mean_;
  const float n = static_cast<float>(T);  // divided by, as torch.mean
  Kokkos::parallel_for(
      "TokenPool::forward", Range(0, B * d), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t b = i / d, j = i - b * d;
        if (!mean) {
          yv(i) = xv(b * T * d + j);
          return;
        }
        float s = 0.0f;
        for (std::int64_t t = 0; t < T; ++t) s += xv((b * T + t) * d + j);
        yv(i) = s / n;
      });
}

// dx(b, t, :) = dy(b, :) at t = 0 and 0 elsewhere, or dy(b, :) / T at every t.
void TokenPool::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  require_plain(dy, "token_pool", "the output gradient");
  if (!needs_input_grad()) return;
  const std::int64_t B = x.batch(), T = T_, d = d_;
  resize(dx, B, in_sample_, "TokenPool::dx");
  ConstView1 g = dy.data;
  View1 dxv = dx.data;
  const bool mean = mean_;
  const float n = static_cast<float>(T);
  Kokkos::parallel_for(
      "TokenPool::backward", rows_range(B, T, d),
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t t, std::int64_t j) {
        const float v = g(b * d + j);
        dxv((b * T + t) * d + j) = mean ? v / n : (t == 0 ? v : 0.0f);
      });
}

}  // namespace ddp
