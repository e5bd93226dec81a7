#include "model/resblock.hpp"

#include "comm/check.hpp"
#include "model/activation.hpp"
#include "model/planes.hpp"
#include "model/select.hpp"

namespace ddp {

ResBlock::ResBlock(std::int64_t channels, std::int64_t stride, bool sync)
    : channels_(channels),
      stride_(stride),
      conv1_(std::make_unique<Conv2d>(channels, 3, stride, 1, false)),
      conv2_(std::make_unique<Conv2d>(channels, 3, 1, 1, false)),
      bn1_(std::make_unique<BatchNorm2d>(sync)),
      bn2_(std::make_unique<BatchNorm2d>(sync)),
      down_bn_(std::make_unique<BatchNorm2d>(sync)) {}

Shape ResBlock::output_shape(const Shape& in_sample) {
  if (in_sample.size() != 3)
    throw InputError("resblock needs an image input (channels, height, width) but gets " +
                     shape_str(in_sample));
  in_sample_ = in_sample;
  projection_ = stride_ != 1 || in_sample[0] != channels_;
  if (projection_) down_conv_ = std::make_unique<Conv2d>(channels_, 1, stride_, 0, false);
  Shape s = conv1_->output_shape(in_sample);
  bn1_->output_shape(s);
  conv2_->output_shape(s);
  bn2_->output_shape(s);
  if (projection_) down_bn_->output_shape(down_conv_->output_shape(in_sample));
  out_sample_ = s;
  return out_sample_;
}

std::vector<ResBlock::Part> ResBlock::parts() const {
  std::vector<Part> p = {
      {conv1_.get(), "conv1."}, {bn1_.get(), "bn1."}, {conv2_.get(), "conv2."}, {bn2_.get(), "bn2."}};
  if (projection_) {
    p.push_back({down_conv_.get(), "downsample.0."});
    p.push_back({down_bn_.get(), "downsample.1."});
  }
  return p;
}

std::vector<Layer::ParamSpec> ResBlock::parameter_specs() const {
  std::vector<ParamSpec> specs;
  for (const Part& part : parts())
    for (const ParamSpec& s : part.layer->parameter_specs())
      specs.push_back({part.prefix + s.suffix, s.shape});
  return specs;
}

void ResBlock::bind(float* params, float* grads) {
  for (const Part& part : parts()) {
    part.layer->bind(params, grads);
    for (const ParamSpec& s : part.layer->parameter_specs()) {
      params += shape_numel(s.shape);
      grads += shape_numel(s.shape);
    }
  }
}

std::vector<Layer::ParamSpec> ResBlock::buffer_specs() const {
  std::vector<ParamSpec> specs;
  for (const Part& part : parts())
    for (const ParamSpec& s : part.layer->buffer_specs()) specs.push_back({part.prefix + s.suffix, s.shape});
  return specs;
}

void ResBlock::bind_buffers(float* buffers) {
  for (const Part& part : parts()) {
    part.layer->bind_buffers(buffers);
    for (const ParamSpec& s : part.layer->buffer_specs()) buffers += shape_numel(s.shape);
  }
}

void ResBlock::init(Rng& rng) {
  for (const Part& part : parts()) part.layer->init(rng);
}

void ResBlock::set_communicator(Communicator* comm) {
  for (const Part& part : parts()) part.layer->set_communicator(comm);
}

void ResBlock::set_precision(Precision p) {
  Layer::set_precision(p);
  for (const Part& part : parts()) part.layer->set_precision(p);
}

void ResBlock::set_overwrite_gradients(bool on) {
  Layer::set_overwrite_gradients(on);
  for (const Part& part : parts()) part.layer->set_overwrite_gradients(on);
}

Layout ResBlock::native_layout() const {
  std::vector<const Conv2d*> convs = {conv1_.get(), conv2_.get()};
  if (projection_) convs.push_back(down_conv_.get());
  const Layout layout = conv1_->native_input_layout();
  for (const Conv2d* conv : convs)
    if (conv->native_input_layout() != layout || conv->native_output_layout() != layout) return Layout::nchw;
  return layout;
}

void ResBlock::set_layouts(Layout in, Layout inside, Layout out) {
  in_ = in;
  inside_ = inside;
  out_ = out;
  for (Conv2d* conv : {conv1_.get(), conv2_.get(), down_conv_.get()})
    if (conv) conv->set_layouts(inside, inside);
}

// x: (B, C_in, H, W) -> y: (B, channels, Ho, Wo)
void ResBlock::forward(const Tensor& x_given, Tensor& y_given, bool training) {
  DDP_REQUIRE(x_given.layout == in_, "resblock input in another layout than the model set");
  const bool convert_in = in_ != inside_, convert_out = out_ != inside_;
  if (convert_in) convert_layout(x_given, x_in_, inside_, "ResBlock::x_in");
  const Tensor& x = convert_in ? x_in_ : x_given;
  Tensor& y = convert_out ? y_in_ : y_given;
  conv1_->forward(x, a1_, training);
  bn1_->forward(a1_, b1_, training);
  resize_like(r1_, b1_, "ResBlock::r1");
  relu_forward(b1_.data, r1_.data, b1_.storage_numel());
  conv2_->forward(r1_, a2_, training);
  bn2_->forward(a2_, b2_, training);
  const Tensor* shortcut = &x;
  if (projection_) {
    down_conv_->forward(x, s1_, training);
    down_bn_->forward(s1_, s2_, training);
    shortcut = &s2_;
  }
  resize_like(y, b2_, "ResBlock::y");
  ConstView1 b2 = b2_.data, sc = shortcut->data;
  View1 yv = y.data;
  Kokkos::parallel_for(
      "ResBlock::add_relu", Range(0, y.storage_numel()), KOKKOS_LAMBDA(std::int64_t i) {
        const float v = b2(i) + sc(i);
        yv(i) = select_or_zero(relu_passes(v), v);
      });
  if (convert_out) convert_layout(y_in_, y_given, out_, "ResBlock::y");
}

// dy: (B, channels, Ho, Wo) -> parameter gradients += (or =), dx: (B, C_in, H, W)
void ResBlock::backward(const Tensor& x_given, const Tensor& y_given, const Tensor& dy_given,
                        Tensor& dx_given) {
  const bool convert_in = in_ != inside_, convert_out = out_ != inside_;
  if (convert_out) convert_layout(dy_given, dy_in_, inside_, "ResBlock::dy_in");
  const Tensor &x = convert_in ? x_in_ : x_given, &y = convert_out ? y_in_ : y_given,
               &dy = convert_out ? dy_in_ : dy_given;
  Tensor& dx = convert_in ? dx_in_ : dx_given;
  // g = dy where the output is positive: the gradient of both branches' sum
  resize_like(g_, dy, "ResBlock::g");
  relu_backward(y.data, dy.data, g_.data, dy.storage_numel());
  bn2_->backward(a2_, b2_, g_, da2_);
  conv2_->backward(r1_, a2_, da2_, dr1_);
  relu_backward(r1_.data, dr1_.data, dr1_.data, dr1_.storage_numel());
  bn1_->backward(a1_, b1_, dr1_, da1_);
  conv1_->set_needs_input_grad(needs_input_grad());
  conv1_->backward(x, a1_, da1_, dx);
  if (projection_) {
    down_bn_->backward(s1_, s2_, g_, ds1_);
    down_conv_->set_needs_input_grad(needs_input_grad());
    down_conv_->backward(x, s1_, ds1_, dx_short_);
  }
  if (!needs_input_grad()) return;
  // dx = main-branch gradient + shortcut gradient
  ConstView1 short_grad = projection_ ? dx_short_.data : g_.data;
  View1 dxv = dx.data;
  Kokkos::parallel_for(
      "ResBlock::add_shortcut_grad", Range(0, dx.storage_numel()),
      KOKKOS_LAMBDA(std::int64_t i) { dxv(i) += short_grad(i); });
  if (convert_in) convert_layout(dx_in_, dx_given, in_, "ResBlock::dx");
}

}  // namespace ddp
