#pragma once
// maxpool(k[, stride=s][, pad=p]), avgpool(k[, stride=s][, pad=p]): nn.MaxPool2d /
// nn.AvgPool2d with floor rounding (PyTorch's default); stride defaults to k, pad to 0
// (at most k/2, as PyTorch). Max never picks a padding element (PyTorch pads with
// -inf); avg counts the padding's zeros (count_include_pad, PyTorch's default), so
// every window divides by k*k.
// globalavgpool: nn.AdaptiveAvgPool2d(1), (C, H, W) -> (C, 1, 1); its x in NCHW or a
// convolution's layout (blocked or nhwc; then dx too), y NCHW.
// Plain Kokkos kernels: these are memory-bound and small next to the convolutions.
// NCHW; every max-pool also channels-last (nhwc), and the 2x2 one also the
// convolutions' blocked layouts (nChw8c, nChw16c), where the model sets them.
// A max-pool on an nhwc x of the narrow type (model/elements.hpp, where the model
// keeps the activations so: Model::plan_types) writes y and dx in that type and
// reads dy in it; globalavgpool reads an nhwc x of that type and writes dx in it.

#include "model/layer.hpp"

namespace ddp {

class Pool2d : public Layer {
 public:
  enum Op { Max, Avg };
  Pool2d(Op op, std::int64_t kernel, std::int64_t stride, std::int64_t pad = 0)
      : op_(op), k_(kernel), stride_(stride), pad_(pad) {}

  std::string kind() const override { return op_ == Max ? "maxpool" : "avgpool"; }
  Shape output_shape(const Shape& in_sample) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // The model's relu -> maxpool fusion: the input is a relu's output, and backward
  // also applies that relu's mask, which for max is free: the input at the argmax is
  // the output y, so the gradient passes where y > 0. The relu then passes dy on.
  void absorb_relu_backward() { relu_mask_ = true; }

  // The model's convolution layouts: a max-pool also takes an x in nhwc, and one with
  // k = 2, stride 2 in nChw8c or nChw16c (from a convolution before), and then writes
  // dx in that layout; y and dy are in the layout set here (nchw unless set): x's for
  // a convolution after, NCHW for anything else. An NCHW x always gives an NCHW y.
  bool takes(Layout layout) const {
    if (layout == Layout::nchw) return true;
    if (layout == Layout::nhwc) return op_ == Max;
    return op_ == Max && k_ == 2 && stride_ == 2 && pad_ == 0;
  }
  // x's layout (the memory plan's: x brings its own to forward) and y's.
  void set_layouts(Layout in, Layout out) {
    in_layout_ = in;
    out_layout_ = out;
  }

  // forward and backward for an x in BS-channel blocks (public only because CUDA's
  // extended lambdas may not live in private member functions)
  template <int BS>
  void forward_blocked(const Tensor& x, Tensor& y);
  template <int BS>
  void backward_blocked(const Tensor& dy, Tensor& dx, Layout x_layout);
  // and for an x in nhwc, any window; Narrow: x, y, dy and dx narrow (elements.hpp),
  // dx of `type`
  template <bool Narrow>
  void forward_nhwc(const Tensor& x, Tensor& y);
  template <bool Narrow>
  void backward_nhwc(const Tensor& dy, Tensor& dx, Precision type);
  // their kernels, V channels a thread (1, or 8 where nhwc_vectors: a load each)
  template <bool Narrow, int V>
  void forward_nhwc_lanes(const Tensor& x, Tensor& y);
  template <bool Narrow, int V>
  void backward_nhwc_lanes(const Tensor& dy, Tensor& dx);
  bool nhwc_vectors(const Tensor& a, const Tensor& b) const;

 private:
  Op op_;
  bool relu_mask_ = false;
  Layout in_layout_ = Layout::nchw, out_layout_ = Layout::nchw;
  std::int64_t k_, stride_, pad_;
  std::int64_t c_ = 0, h_ = 0, w_ = 0, ho_ = 0, wo_ = 0;
  Shape in_sample_, out_sample_;  // (C, H, W), (C, Ho, Wo)
  // max: (B, C, Ho, Wo) offset of the max inside its (H, W) plane; for a blocked x
  // (B, C/BS, Ho, Wo, BS), for an nhwc x (B, Ho, Wo, C), and then -1 where the relu
  // mask stops the gradient
  Kokkos::View<std::int32_t*> argmax_;
  Tensor dy_blocked_;  // (B, C, Ho, Wo) blocked as x: an NCHW dy for the blocked backward
};

class GlobalAvgPool : public Layer {
 public:
  std::string kind() const override { return "globalavgpool"; }
  Shape output_shape(const Shape& in_sample) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

  // forward for an x in BS-channel blocks, and in nhwc of either type; backward's
  // pass, dx of either type (public for CUDA's extended lambdas)
  template <int BS>
  void forward_blocked(std::int64_t B, ConstView1 xv, View1 yv);
  template <bool Narrow>
  void forward_nhwc(const Tensor& x, View1 yv);
  template <bool Narrow>
  void spread(const Tensor& dy, Tensor& dx);

 private:
  std::int64_t c_ = 0, hw_ = 0;
  Shape in_sample_, out_sample_;  // (C, H, W), (C, 1, 1)
};

}  // namespace ddp
