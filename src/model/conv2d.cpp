#include "model/conv2d.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/check.hpp"
#include "model/elements.hpp"
#include "model/planes.hpp"

namespace ddp {

Conv2d::Conv2d(std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
               bool bias) {
  geometry_.out = out_channels;
  geometry_.k = kernel;
  geometry_.stride = stride;
  geometry_.pad = pad;
  geometry_.bias = bias;
}

Conv2d::~Conv2d() = default;

Shape Conv2d::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("conv2d needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  ConvGeometry& g = geometry_;
  g.in = in_sample[0];
  g.h = in_sample[1];
  g.w = in_sample[2];
  if (g.h + 2 * g.pad < g.k || g.w + 2 * g.pad < g.k)
    throw InputError("kernel " + std::to_string(g.k) + " is larger than the padded input " +
                     shape_str(in_sample));
  in_sample_ = in_sample;
  out_sample_ = {g.out, g.ho(), g.wo()};
  kernels_ = compute_backend().make_conv(g);
  configure();
  return out_sample_;
}

std::vector<Layer::ParamSpec> Conv2d::parameter_specs() const {
  const ConvGeometry& g = geometry_;
  std::vector<ParamSpec> specs = {{"weight", {g.out, g.in, g.k, g.k}}};
  if (g.bias) specs.push_back({"bias", {g.out}});
  return specs;
}

void Conv2d::bind(float* params, float* grads) {
  const ConvGeometry& g = geometry_;
  const std::int64_t nw = g.out * g.in * g.k * g.k;
  weight_ = params;
  dweight_ = grads;
  bias_ = g.bias ? params + nw : nullptr;
  dbias_ = g.bias ? grads + nw : nullptr;
}

void Conv2d::init(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)) and PyTorch's bias rule: U(-1/sqrt(fan_in), +) with
  // fan_in = in * k * k.
  const ConvGeometry& g = geometry_;
  float bound = 1.0f / std::sqrt(static_cast<float>(g.in * g.k * g.k));
  fill_uniform(weight_, g.out * g.in * g.k * g.k, -bound, bound, rng.next_u64());
  if (g.bias) fill_uniform(bias_, g.out, -bound, bound, rng.next_u64());
}

void Conv2d::configure() {
  if (!kernels_) return;
  const bool narrow = in_type_ != Precision::fp32 || out_type_ != Precision::fp32,
             of_precision = (in_type_ == Precision::fp32 || in_type_ == precision()) &&
                            (out_type_ == Precision::fp32 || out_type_ == precision());
  widened_ = narrow && !(of_precision && kernels_->takes_narrow_activations(precision()));
  const Precision in = widened_ ? Precision::fp32 : in_type_, out = widened_ ? Precision::fp32 : out_type_;
  kernels_->configure(precision(), fused_relu_, {in_layout_, in}, {out_layout_, out});
}

void Conv2d::set_precision(Precision p) {
  Layer::set_precision(p);
  configure();
}

void Conv2d::fuse_relu() {
  fused_relu_ = true;
  configure();
}

void Conv2d::set_layouts(Layout in, Layout out) {
  in_layout_ = in;
  out_layout_ = out;
  configure();
}

void Conv2d::set_types(Precision in, Precision out) {
  if (in == in_type_ && out == out_type_) return;  // the kernels stay planned
  in_type_ = in;
  out_type_ = out;
  configure();
}

std::int64_t Conv2d::kept_floats(std::int64_t batch, bool input_grad, bool accumulate) const {
  auto in = [&](Precision t) { return planned_floats(batch, in_sample_, in_layout_, t); };
  auto out = [&](Precision t) { return planned_floats(batch, out_sample_, out_layout_, t); };
  const bool wide_in = widened_ && in_type_ != Precision::fp32,
             wide_out = widened_ && out_type_ != Precision::fp32;
  std::int64_t floats = 0;
  if (wide_in) floats += in(Precision::fp32) * (input_grad ? 2 : 1);  // x_wide_, dx_wide_
  if (wide_out) floats += 2 * out(Precision::fp32);                   // y_wide_, dy_wide_
  if (input_grad && accumulate && (narrow_dx_from_wide() || !kernels_->accumulates_input_grad()))
    floats += in(in_type_);  // dx_part_
  return floats;
}

const Tensor& Conv2d::for_kernels(const Tensor& t, Tensor& wide, const char* label) const {
  if (!widened_ || t.type == Precision::fp32) return t;
  convert_type(t, wide, Precision::fp32, label);
  return wide;
}

// x: (B, in, h, w) -> y: (B, out, ho, wo), rectified when fused with a relu
void Conv2d::forward(const Tensor& x, Tensor& y, bool /*training*/) { run_forward(x, y, nullptr); }

bool Conv2d::forward_with_sums(const Tensor& x, Tensor& y, float* sums) {
  return run_forward(x, y, computes_sums() ? sums : nullptr);
}

bool Conv2d::forward_after(const Tensor& x, const float* scale_shift, Tensor& y, float* sums) {
  DDP_REQUIRE(scale_shift && sums, "conv2d: a forward after a batch norm without its map or sums");
  return takes_prologue() && run_forward(x, y, sums, scale_shift);
}

bool Conv2d::run_forward(const Tensor& x_given, Tensor& y, float* sums, const float* scale_shift) {
  DDP_REQUIRE(x_given.layout == in_layout_ && x_given.type == in_type_,
              "conv2d input in another layout or type than the model set");
  const std::int64_t B = x_given.batch();
  resize(y, B, out_sample_, "Conv2d::y", out_layout_, out_type_);
  const Tensor& x = for_kernels(x_given, x_wide_, "Conv2d::x_wide");
  const bool narrow_y = widened_ && out_type_ != Precision::fp32;
  if (narrow_y) resize(y_wide_, B, out_sample_, "Conv2d::y_wide", out_layout_);
  float* to = (narrow_y ? y_wide_ : y).data.data();
  if (scale_shift) {  // forward_after: nothing more where the kernels decline
    if (!kernels_->forward_stats_after(B, x.data.data(), scale_shift, weight_, to, sums)) return false;
    if (narrow_y) convert_type(y_wide_, y, out_type_, "Conv2d::y");
    return true;
  }
  const bool with_sums = sums && kernels_->forward_stats(B, x.data.data(), weight_, to, sums);
  if (!with_sums) kernels_->forward(B, x.data.data(), weight_, bias_, to);
  if (narrow_y) convert_type(y_wide_, y, out_type_, "Conv2d::y");
  return with_sums;
}

// dy: (B, out, ho, wo) -> dW (out, in, k, k) += (or =), db (out) += (or =), dx: (B, in, h, w) = (or +=)
void Conv2d::backward(const Tensor& x_given, const Tensor& /*y*/, const Tensor& dy_given, Tensor& dx) {
  DDP_REQUIRE(dy_given.layout == out_layout_ && dy_given.type == out_type_,
              "conv2d output gradient in another layout or type than the model set");
  const std::int64_t B = x_given.batch();
  const Tensor& x = for_kernels(x_given, x_wide_, "Conv2d::x_wide");
  const Tensor& dy = for_kernels(dy_given, dy_wide_, "Conv2d::dy_wide");
  kernels_->backward_weights(B, x.data.data(), dy.data.data(), dweight_, dbias_, !overwrite_gradients());
  backward_input(B, dy, dx);
}

bool Conv2d::backward_after(const Tensor& x_given, const float* scale_shift, const Tensor& dy_given,
                            Tensor& dx, InputGradSums* sums) {
  DDP_REQUIRE(dy_given.layout == out_layout_ && dy_given.type == out_type_,
              "conv2d output gradient in another layout or type than the model set");
  if (sums) sums->written = false;
  if (!takes_prologue()) return false;
  const std::int64_t B = x_given.batch();
  const Tensor& x = for_kernels(x_given, x_wide_, "Conv2d::x_wide");
  const Tensor& dy = for_kernels(dy_given, dy_wide_, "Conv2d::dy_wide");
  if (!kernels_->backward_weights_after(B, x.data.data(), scale_shift, dy.data.data(), dweight_,
                                        !overwrite_gradients()))
    return false;
  if (sums && needs_input_grad() && !accumulate_dx_ && kernels_->has_backward_data_sums()) {
    // dx written by the kernels (through dx_wide_ where they take fp32 and dx is narrow)
    resize(dx, B, in_sample_, "Conv2d::dx", in_layout_, in_type_);
    const bool narrow_dx = narrow_dx_from_wide();
    if (narrow_dx) resize(dx_wide_, B, in_sample_, "Conv2d::dx_wide", in_layout_);
    Tensor& to = narrow_dx ? dx_wide_ : dx;
    if (kernels_->backward_data_sums(B, dy.data.data(), weight_, x.data.data(), scale_shift, sums->mean,
                                     to.data.data(), sums->sums)) {
      if (narrow_dx) convert_type(dx_wide_, dx, in_type_, "Conv2d::dx");
      sums->written = true;
      return true;
    }
  }
  backward_input(B, dy, dx);
  return true;
}

void Conv2d::backward_input(std::int64_t B, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  if (!accumulate_dx_) return input_grad(B, dy, dx);
  DDP_REQUIRE(dx.numel() > 0 && dx.batch() == B &&
                  std::equal(dx.shape.begin() + 1, dx.shape.end(), in_sample_.begin(), in_sample_.end()) &&
                  dx.layout == in_layout_ && dx.type == in_type_,
              "conv2d: the input gradient to add to is not of the input's shape, layout and type");
  if (!narrow_dx_from_wide() && kernels_->accumulates_input_grad()) {
    kernels_->backward_data(B, dy.data.data(), weight_, dx.data.data(), true);
    return;
  }
  input_grad(B, dy, dx_part_);
  add_elements("Conv2d::add_input_grad", dx_part_, dx);
}

void Conv2d::input_grad(std::int64_t B, const Tensor& dy, Tensor& dx) {
  resize(dx, B, in_sample_, "Conv2d::dx", in_layout_, in_type_);
  const bool narrow_dx = narrow_dx_from_wide();
  if (narrow_dx) resize(dx_wide_, B, in_sample_, "Conv2d::dx_wide", in_layout_);
  kernels_->backward_data(B, dy.data.data(), weight_, (narrow_dx ? dx_wide_ : dx).data.data(), false);
  if (narrow_dx) convert_type(dx_wide_, dx, in_type_, "Conv2d::dx");
}

}  // namespace ddp
