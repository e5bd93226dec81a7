#pragma once
// Element-wise activations: relu, tanh. Any input shape; output has the same shape
// and layout (a blocked layout's zero padding channels stay zero).
// Backward reads the output y (not x), as PyTorch does.

#include "model/layer.hpp"

namespace ddp {

class ReLU : public Layer {
 public:
  std::string kind() const override { return "relu"; }
  Shape output_shape(const Shape& in_sample) override { return in_sample; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // Fusions the model sets up, each saving a pass over the activation. The layer
  // keeps its place (and name) in the model; a fused direction shares its buffer:
  // forward: the layer before already rectified x (conv2d's post-op), so y = x;
  // backward: the layer after already masked its dx (max-pool), so dx = dy.
  void fuse_forward() { fused_forward_ = true; }
  void fuse_backward() { fused_backward_ = true; }
  // Fused both ways, the layer hands its neighbours' tensors on, whatever their layout.
  bool passes_through() const { return fused_forward_ && fused_backward_; }
  bool output_is_input() const override { return fused_forward_; }
  bool input_grad_is_output_grad() const override { return fused_backward_; }

 private:
  bool fused_forward_ = false, fused_backward_ = false;
};

// The relu kernels, which resblock runs too: y = relu(x) over n elements; dx = dy
// where the relu let x through (judged on its output y), over y's elements, all three
// of y's type (fp32, or narrow inside residual blocks: model/elements.hpp), dx sized
// by the caller; dx may be dy (in place).
void relu_forward(ConstView1 x, View1 y, std::int64_t n);
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

class Tanh : public Layer {
 public:
  std::string kind() const override { return "tanh"; }
  Shape output_shape(const Shape& in_sample) override { return in_sample; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
};

}  // namespace ddp
