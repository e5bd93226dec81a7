#pragma once
// A vision transformer's own layers, around the blocks it shares with GPT-2
// (transformer_block.hpp): torchvision's VisionTransformer is
//   patch_embed(p, d), class_token, pos_embedding(T + 1), blocks, layernorm,
//   token_pool, linear(classes)
// (its _process_input, class_token, encoder.pos_embedding, encoder.layers, encoder.ln,
// x[:, 0], heads.head).
//
// patch_embed(p, d): an image (C, H, W), H and W multiples of p, into T = (H/p)(W/p)
// tokens of d features: torchvision's conv_proj, nn.Conv2d(C, d, p, stride=p), then
// (d, H/p, W/p) -> (T, d) with the patches in row order (reshape(d, T).permute(1, 0)).
// Parameters weight (d, C, p, p) and bias (d), the convolution's (this project's
// conv2d, so oneDNN or cuDNN runs it), initialised as nn.Conv2d (torchvision
// re-initialises it: io.init_from takes its weights).
//
// class_token: (T, d) -> (T + 1, d), a learned token first (torchvision's class_token,
// shape (1, 1, d), initialised to zeros as there). Its gradient is the sum over the
// batch of dy's first token, in batch order.
//
// token_pool[(mean)]: (T, d) -> (d), the class token's features (x[:, 0], what ViT's
// head reads), or with `mean` the mean over the T tokens (a classifier without a class
// token). No parameters.

#include <memory>

#include "model/conv2d.hpp"

namespace ddp {

class PatchEmbed : public Layer {
 public:
  PatchEmbed(std::int64_t patch, std::int64_t d);

  std::string kind() const override { return "patch_embed"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override { return conv_->parameter_specs(); }
  void bind(float* params, float* grads) override { conv_->bind(params, grads); }
  void init(Rng& rng) override { conv_->init(rng); }
  std::string graph_obstacle() const override { return conv_->graph_obstacle(); }
  std::int64_t library_bytes(std::int64_t batch) const override { return conv_->library_bytes(batch); }
  void set_precision(Precision p) override;
  void set_overwrite_gradients(bool on) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void scratch_floats(std::int64_t batch, SlotFloats& most) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t patch_, d_, T_ = 0;
  Shape sample_;                  // (T, d)
  std::unique_ptr<Conv2d> conv_;  // (C, H, W) -> (d, H/p, W/p)
  Tensor c_;                      // (B, d, H/p, W/p): the convolution's output
  Tensor dc_;                     // (B, d, H/p, W/p): its gradient
};

class ClassToken : public Layer {
 public:
  std::string kind() const override { return "class_token"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override { return {{"weight", {1, 1, d_}}}; }
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t T_ = 0, d_ = 0;
  Shape in_sample_, sample_;  // (T, d), (T + 1, d)
  float* weight_ = nullptr;   // (d)
  float* dweight_ = nullptr;  // (d)
};

class TokenPool : public Layer {
 public:
  explicit TokenPool(bool mean) : mean_(mean) {}

  std::string kind() const override { return "token_pool"; }
  Shape output_shape(const Shape& in_sample) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  bool mean_;
  std::int64_t T_ = 0, d_ = 0;
  Shape in_sample_, sample_;  // (T, d), (d)
};

}  // namespace ddp
