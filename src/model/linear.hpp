#pragma once
// linear(n): y = x W^T + b, PyTorch's nn.Linear. Input flat (B, in), or a sequence
// (B, T, in) acted on per token, as nn.Linear does: one GEMM over the B T rows.
// With a relu fused (Model::fuse_layers), the bias pass writes relu(x W^T + b) and
// backward masks dy by that output in place first (the relu's own pass, moved).

#include "model/layer.hpp"

namespace ddp {

class Linear : public Layer {
 public:
  explicit Linear(std::int64_t out_features) : out_(out_features) {}

  std::string kind() const override { return "linear"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void fuse_relu() { fused_relu_ = true; }

 private:
  bool fused_relu_ = false;
  std::int64_t in_ = 0;
  std::int64_t out_;
  Shape in_sample_, out_sample_;  // ([T,] in), ([T,] out): kept so resizing allocates nothing
  float* weight_ = nullptr;       // (out, in)
  float* bias_ = nullptr;         // (out)
  float* dweight_ = nullptr;      // (out, in)
  float* dbias_ = nullptr;        // (out)
  View1 ones_;                    // (N) all 1, N = B [T]: the bias gradient is the GEMV dy^T ones
};

}  // namespace ddp
