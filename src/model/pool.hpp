#pragma once
// maxpool(k[, stride=s]), avgpool(k[, stride=s]): nn.MaxPool2d / nn.AvgPool2d with
// no padding and floor rounding (PyTorch's defaults); stride defaults to k.
// globalavgpool: nn.AdaptiveAvgPool2d(1), (C, H, W) -> (C, 1, 1).
// Plain Kokkos kernels: these are memory-bound and small next to the convolutions.

#include "model/layer.hpp"

namespace ddp {

class Pool2d : public Layer {
 public:
  enum Op { Max, Avg };
  Pool2d(Op op, std::int64_t kernel, std::int64_t stride) : op_(op), k_(kernel), stride_(stride) {}

  std::string kind() const override { return op_ == Max ? "maxpool" : "avgpool"; }
  Shape output_shape(const Shape& in_sample) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // The model's relu -> maxpool fusion: the input is a relu's output, and backward
  // also applies that relu's mask, which for max is free: the input at the argmax is
  // the output y, so the gradient passes where y > 0. The relu then passes dy on.
  void absorb_relu_backward() { relu_mask_ = true; }

 private:
  Op op_;
  bool relu_mask_ = false;
  std::int64_t k_, stride_;
  std::int64_t c_ = 0, h_ = 0, w_ = 0, ho_ = 0, wo_ = 0;
  Shape in_sample_, out_sample_;  // (C, H, W), (C, Ho, Wo)
  Kokkos::View<std::int32_t*> argmax_;  // (B, C, Ho, Wo) max: offset of the max inside its (H, W) plane
};

class GlobalAvgPool : public Layer {
 public:
  std::string kind() const override { return "globalavgpool"; }
  Shape output_shape(const Shape& in_sample) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t c_ = 0, hw_ = 0;
  Shape in_sample_, out_sample_;  // (C, H, W), (C, 1, 1)
};

}  // namespace ddp
