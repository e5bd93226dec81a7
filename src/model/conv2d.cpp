#include "model/conv2d.hpp"

#include <cmath>
#include <string>

#include "comm/check.hpp"

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
  if (kernels_) kernels_->configure(precision(), fused_relu_, in_layout_, out_layout_);
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

// x: (B, in, h, w) -> y: (B, out, ho, wo), rectified when fused with a relu
void Conv2d::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  DDP_REQUIRE(x.layout == in_layout_, "conv2d input in another layout than the model set");
  const std::int64_t B = x.batch();
  resize(y, B, out_sample_, "Conv2d::y", out_layout_);
  kernels_->forward(B, x.data.data(), weight_, bias_, y.data.data());
}

// dy: (B, out, ho, wo) -> dW (out, in, k, k) += (or =), db (out) += (or =), dx: (B, in, h, w)
void Conv2d::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  DDP_REQUIRE(dy.layout == out_layout_, "conv2d output gradient in another layout than the model set");
  const std::int64_t B = x.batch();
  kernels_->backward_weights(B, x.data.data(), dy.data.data(), dweight_, dbias_, !overwrite_gradients());
  if (!needs_input_grad()) return;
  resize(dx, B, in_sample_, "Conv2d::dx", in_layout_);
  kernels_->backward_data(B, dy.data.data(), weight_, dx.data.data());
}

}  // namespace ddp
