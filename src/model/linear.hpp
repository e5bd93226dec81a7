#pragma once
// linear(n[, bias=false][, tied]): y = x W^T + b, PyTorch's nn.Linear (bias=False
// without b). Input flat (B, in), or a sequence (B, T, in) acted on per token, as
// nn.Linear does: one GEMM over the B T rows.
// tied: a language model's head whose weight IS the model's token embedding table
// (GPT-2's lm_head, tied to wte): no weight of its own; the model binds the
// embedding's (vocab, d) table and its gradient to it (Model, tie()), checks that
// n = vocab and in = d, and backward adds this head's part of the table's gradient
// to the embedding's (the head runs first, so it writes where the model overwrites).
// The bias (and a fused relu or GELU) is the GEMM's epilogue (model/gemm.hpp's
// gemm_epilogue: cuBLASLt's on the GPU, one pass after the GEMM on the host). With a
// relu fused (Model::fuse_layers) it writes relu(x W^T + b), and backward masks dy by
// that output in place first (the relu's own pass, moved).

#include "model/gemm.hpp"
#include "model/layer.hpp"

namespace ddp {

class Linear : public Layer {
 public:
  explicit Linear(std::int64_t out_features, bool bias = true, bool tied = false)
      : out_(out_features), has_bias_(bias), tied_(tied) {}

  std::string kind() const override { return "linear"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void scratch_floats(std::int64_t batch, SlotFloats& most) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void fuse_relu() { fused_relu_ = true; }
  // y = add + (x W^T + b): a residual sum in the GEMM's epilogue (add (B, [T,] out),
  // fp32, as y; not with a fused relu). forward is it without a residual.
  void forward_adding(const Tensor& x, const Tensor* add, Tensor& y, bool training);
  // A transformer block's MLP: the GELU after this layer in its GEMM's epilogue.
  // forward_gelu: pre = x W^T + b (the GELU's input, kept for backward) and y =
  // gelu(pre), each of the output type, as forward then Gelu::forward would give them.
  // backward_gelu, on the layer after the GELU: its backward, with dx = (dy W)
  // gelu'(pre) made by the dx GEMM, the GELU's input gradient (the GELU's backward and
  // its output gradient's buffer gone).
  void forward_gelu(const Tensor& x, Tensor& pre, Tensor& y, bool tanh);
  void backward_gelu(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& pre, Tensor& dx,
                     bool tanh);
  // The types of x and dx (in) and of y and dy (out): fp32, or the narrow type of the
  // layer's precision where a transformer block keeps its inner activations so
  // (TransformerBlock::set_types). The GEMMs read and write them as they are
  // (gemm_stored), a narrow y rounded once, after its bias. Not with a fused relu.
  void set_types(Precision in, Precision out);
  bool tied() const { return tied_; }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  // tied: the weight (out, in) and its gradient, the embedding's; after bind().
  void tie(float* weight, float* dweight);

 private:
  void backward_into(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                     const GemmEpilogue& dx_epilogue);

  bool fused_relu_ = false;
  Precision in_type_ = Precision::fp32, out_type_ = Precision::fp32;  // set_types
  std::int64_t in_ = 0;
  std::int64_t out_;
  bool has_bias_, tied_;
  Shape in_sample_, out_sample_;  // ([T,] in), ([T,] out): kept so resizing allocates nothing
  float* weight_ = nullptr;       // (out, in)
  float* bias_ = nullptr;         // (out); nullptr without bias
  float* dweight_ = nullptr;      // (out, in)
  float* dbias_ = nullptr;        // (out)
  View1 ones_;                    // (N) all 1, N = B [T]: the bias gradient is the GEMV dy^T ones
};

}  // namespace ddp
