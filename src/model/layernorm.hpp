#pragma once
// layernorm[(eps=e)]: PyTorch's nn.LayerNorm(d, eps) over the last dimension d of a
// flat (d) or sequence (T, d) sample: each row of d values is normalised by its own
// mean and biased variance, then scaled and shifted per feature,
// y = (x - mean) / sqrt(var + eps) weight + bias, eps 1e-5 by default (GPT-2's; ViT
// uses 1e-6). Parameters weight (d), ones, and bias (d), zeros, in PyTorch's names.
// The statistics in double per row. Parameter gradients are sums over the rows in an
// order fixed by the row count alone, so a run repeats bit for bit. NCHW; x and dx
// fp32; y and dy fp32 too but inside a transformer block that keeps its inner
// activations narrow (set_output_type), where they are of that type (computed in fp32,
// y rounded once).

#include "model/layer.hpp"

namespace ddp {

class LayerNorm : public Layer {
 public:
  explicit LayerNorm(float eps = 1e-5f) : eps_(eps) {}

  std::string kind() const override { return "layernorm"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // backward with dx written as `residual` plus the layer's input gradient, in the same
  // pass: a pre-norm block's residual sum (TransformerBlock: dr = dy + ln_2's, dx = dr +
  // ln_1's), which then takes no pass nor buffer of its own. residual: fp32, x's shape,
  // not dx's buffer. The same bits as the sum taken after, but where the compiler fuses
  // the last multiply and the add (an FMA).
  void backward_adding(const Tensor& x, const Tensor& dy, const Tensor& residual, Tensor& dx);
  // The type of y and dy: fp32 (the default) or a narrow one.
  void set_output_type(Precision type) { out_type_ = type; }
  // The passes, y and dy narrow (Narrow) or fp32; dx with a residual added (Adding).
  // Public only because CUDA's extended lambdas may not live in private members.
  template <bool Narrow>
  void forward_rows(const Tensor& x, Tensor& y);
  template <bool Narrow, bool Adding>
  void backward_rows(const Tensor& x, const Tensor& dy, const float* residual, Tensor& dx);

 private:
  float eps_;
  Precision out_type_ = Precision::fp32;
  std::int64_t d_ = 0;
  Shape sample_;              // (d) or (T, d)
  float* weight_ = nullptr;   // (d)
  float* bias_ = nullptr;     // (d)
  float* dweight_ = nullptr;  // (d)
  float* dbias_ = nullptr;    // (d)
  // (rows = B T) of the last forward: the mean as hi + lo (mean_, mean_lo_: x - mean to
  // a double's accuracy in float arithmetic), 1 / sqrt(var + eps)
  View1 mean_, mean_lo_, rstd_;
  Kokkos::View<double*> partial_;  // (2, K, d) backward's sums over K stretches of rows
};

}  // namespace ddp
