#include "model/flatten.hpp"

namespace ddp {

// y (B, F) aliases x (B, d1, d2, ...)
void Flatten::forward(const Tensor& x, Tensor& y, bool /*training*/) {
  y.data = x.data;
  y.shape.resize(2);
  y.shape[0] = x.batch();
  y.shape[1] = x.sample_numel();
}

// dx (B, d1, d2, ...) aliases dy (B, F)
void Flatten::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  dx.data = dy.data;
  dx.shape = x.shape;
}

}  // namespace ddp
