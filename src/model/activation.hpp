#pragma once
// Element-wise activations: relu, tanh. Any input shape; output has the same shape.
// Backward reads the output y (not x), as PyTorch does.

#include "model/layer.hpp"

namespace ddp {

class ReLU : public Layer {
 public:
  std::string kind() const override { return "relu"; }
  Shape output_shape(const Shape& in_sample) override { return in_sample; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
};

class Tanh : public Layer {
 public:
  std::string kind() const override { return "tanh"; }
  Shape output_shape(const Shape& in_sample) override { return in_sample; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
};

}  // namespace ddp
