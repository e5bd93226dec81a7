#pragma once
// gelu[(tanh)]: PyTorch's nn.GELU. Exact (the default, approximate='none'):
// y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); with `tanh` (approximate='tanh', GPT-2's):
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any input shape, any layout
// (gelu(0) = 0: a blocked layout's padding channels stay zero); y is x's shape,
// layout and type (fp32, or narrow inside a transformer block: TransformerBlock::
// set_types; computed in fp32 and rounded once), dx that of x and dy. Backward reads
// x, as PyTorch's GeluBackward does.

#include "model/layer.hpp"

namespace ddp {

class Gelu : public Layer {
 public:
  explicit Gelu(bool tanh_approximation) : tanh_(tanh_approximation) {}

  std::string kind() const override { return "gelu"; }
  bool tanh_approximation() const { return tanh_; }
  Shape output_shape(const Shape& in_sample) override { return in_sample; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  bool tanh_;
};

}  // namespace ddp
