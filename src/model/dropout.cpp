#include "model/dropout.hpp"

namespace ddp {

void Dropout::reseed(std::uint64_t seed) {
  seed_ = seed;
  calls_ = 0;
}

void Dropout::forward(const Tensor& x, Tensor& y, bool training) {
  masked_ = training && p_ > 0.0f;
  if (!masked_) {  // identity
    y.data = x.data;
    y.shape = x.shape;
    return;
  }
  resize_like(mask_, x, "Dropout::mask");
  resize_like(y_, x, "Dropout::y");
  const std::uint64_t key = hash64(seed_, calls_++);
  const float p = p_, scale = 1.0f / (1.0f - p_);
  ConstView1 xv = x.data;
  View1 mv = mask_.data, yv = y_.data;
  Kokkos::parallel_for(
      "Dropout::forward", Range(0, x.numel()), KOKKOS_LAMBDA(std::int64_t i) {
        mv(i) = u01(hash64(key, i)) >= p ? scale : 0.0f;
        yv(i) = xv(i) * mv(i);
      });
  y = y_;
}

// dx = dy * mask
void Dropout::backward(const Tensor& x, const Tensor& /*y*/, const Tensor& dy, Tensor& dx) {
  if (!needs_input_grad()) return;
  if (!masked_) {
    dx.data = dy.data;
    dx.shape = dy.shape;
    return;
  }
  resize_like(dx_, x, "Dropout::dx");
  ConstView1 mv = mask_.data, dyv = dy.data;
  View1 dxv = dx_.data;
  Kokkos::parallel_for(
      "Dropout::backward", Range(0, x.numel()), KOKKOS_LAMBDA(std::int64_t i) { dxv(i) = dyv(i) * mv(i); });
  dx = dx_;
}

}  // namespace ddp
