#pragma once
// flatten: (B, d1, d2, ...) -> (B, d1*d2*...), like nn.Flatten(). A reshape only:
// y shares x's buffer and dx shares dy's, so it costs no copy.

#include "model/layer.hpp"

namespace ddp {

class Flatten : public Layer {
 public:
  std::string kind() const override { return "flatten"; }
  Shape output_shape(const Shape& in_sample) override { return {shape_numel(in_sample)}; }
  bool output_is_input() const override { return true; }
  bool input_grad_is_output_grad() const override { return true; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
};

}  // namespace ddp
