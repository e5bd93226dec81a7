#pragma once
// resblock(channels[, stride=s][, sync]): torchvision's BasicBlock.
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1: 3x3, stride s, pad 1; conv2: 3x3, pad 1; neither has a bias. shortcut is
// the identity, or downsample = 1x1 conv (stride s, no bias) + bn when the stride
// is not 1 or the channel count changes. Parameter and buffer names are
// BasicBlock's ("conv1.weight", "bn1.running_mean", "downsample.0.weight", ...), so
// the model's "layers.<i>." prefix gives the keys of an nn.Sequential of blocks.
// In the model's plan (set_layouts), the block computes in its convolutions' blocked
// layout (nChw8c / nChw16c on the host), batch norms and relus included; x and y are
// reordered at its edges only where the model hands over or wants another layout.

#include <memory>

#include "model/batchnorm.hpp"
#include "model/conv2d.hpp"

namespace ddp {

class ResBlock : public Layer {
 public:
  ResBlock(std::int64_t channels, std::int64_t stride, bool sync);

  std::string kind() const override { return "resblock"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  std::vector<ParamSpec> buffer_specs() const override;
  void bind_buffers(float* buffers) override;
  void init(Rng& rng) override;
  void set_communicator(Communicator* comm) override;
  void set_precision(Precision p) override;
  void set_overwrite_gradients(bool on) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // The layout the block's convolutions all read and write natively at the current
  // precision (nchw when they do not agree on a blocked one).
  Layout native_layout() const;
  // The layouts of x and dx (in), of the block's own activations (inside) and of y
  // and dy (out); nchw unless set.
  void set_layouts(Layout in, Layout inside, Layout out);

 private:
  struct Part {  // a sub-layer and the name prefix of its parameters
    Layer* layer;
    const char* prefix;
  };
  std::vector<Part> parts() const;  // conv1, bn1, conv2, bn2[, downsample.0, downsample.1]

  std::int64_t channels_, stride_;
  bool projection_ = false;
  Shape in_sample_, out_sample_;  // (C_in, H, W), (channels, Ho, Wo)
  std::unique_ptr<Conv2d> conv1_, conv2_, down_conv_;
  std::unique_ptr<BatchNorm2d> bn1_, bn2_, down_bn_;
  // Activations, all (B, channels, Ho, Wo): conv1, bn1, relu, conv2, bn2; shortcut conv, bn
  Tensor a1_, b1_, r1_, a2_, b2_, s1_, s2_;
  // Gradients: of the pre-relu sum, of r1 (then b1, in place), of a1, a2, and s1
  Tensor g_, dr1_, da1_, da2_, ds1_;
  Tensor dx_short_;  // (B, C_in, H, W) gradient through the projection
  Layout in_ = Layout::nchw, inside_ = Layout::nchw, out_ = Layout::nchw;
  // Where in_ or out_ is not inside_: x, dx, y and dy in the inside layout
  Tensor x_in_, dx_in_, y_in_, dy_in_;
};

}  // namespace ddp
