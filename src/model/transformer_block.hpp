#pragma once
// transformer_block(heads[, mlp=4][, causal][, tanh][, eps=e][, block=N][, fused]): the
// pre-norm block of GPT-2 and ViT, torchvision's EncoderBlock (vision_transformer.py) with dropout 0:
//   r = x + self_attention(ln_1(x))          attention(heads[, causal])
//   y = r + mlp(ln_2(r))                     mlp: linear(mlp d) -> gelu -> linear(d)
// on a (T, d) sample. causal: GPT-2's masked attention (ViT's is not); tanh: GPT-2's
// tanh GELU (ViT's is exact); eps: the layer norms' (1e-5 by default, GPT-2's; ViT's
// 1e-6); block, fused: the attention's (attention.hpp: its paths for long sequences).
// Parameters in EncoderBlock's names under the model's "layers.<i>." prefix:
// ln_1.weight, ln_1.bias, self_attention.in_proj_weight, self_attention.in_proj_bias,
// self_attention.out_proj.weight, self_attention.out_proj.bias, ln_2.weight, ln_2.bias,
// mlp.0.weight, mlp.0.bias (mlp d, d), mlp.3.weight, mlp.3.bias (d, mlp d): the
// indices of its MLPBlock's nn.Sequential (Linear, GELU, Dropout, Linear, Dropout).
// Each part initialises as its own layer does (nn.LayerNorm, nn.MultiheadAttention,
// nn.Linear); torchvision's ViT re-initialises the MLP (xavier_uniform_, bias normal
// 1e-6) and nanoGPT everything (normal 0.02): io.init_from takes their weights.
// The parts are this project's own layers (layernorm.hpp, attention.hpp, linear.hpp,
// gelu.hpp), so each keeps its arithmetic and its fixed order of sums. The GELU runs
// in its neighbours' GEMMs' epilogues (Linear::forward_gelu, backward_gelu: on the GPU
// cuBLASLt's for the tanh form), computed as the gelu layer computes it.

#include <memory>

#include "model/attention.hpp"
#include "model/gelu.hpp"
#include "model/layernorm.hpp"
#include "model/linear.hpp"

namespace ddp {

class TransformerBlock : public Layer {
 public:
  TransformerBlock(std::int64_t heads, std::int64_t mlp_ratio, bool causal, bool tanh, float eps,
                   std::int64_t block = Attention::kAutoBlock, bool fused = false);

  std::string kind() const override { return "transformer_block"; }
  const Attention& attention() const { return *attn_; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  std::string graph_obstacle() const override;
  void set_precision(Precision p) override;
  void set_overwrite_gradients(bool on) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void scratch_floats(std::int64_t batch, SlotFloats& most) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // The type of the activations inside (`inside`: fp32, or the narrow type of the
  // block's precision where the model keeps activations narrow, as the GPU's bf16 and
  // fp16 do), as PyTorch's AMP keeps them: the layer norms' outputs a and c, the MLP's
  // f and g, and their gradients, written and read in that type (the GEMMs read and
  // write them as they are: gemm_stored); the residual stream x, r, y, its gradients
  // and the outputs the sums take (h, m) fp32, as AMP's sums of an fp32 and a bf16
  // tensor are. In GPT-2 124M those are 10 of the 14 d-wide rows a token's block
  // writes in forward (f and g are 4 d each), so half the bytes there.
  void set_types(Precision inside);
  Precision inside_type() const { return inside_; }

 private:
  struct Part {
    Layer* layer;
    std::string prefix;  // "ln_1."
  };
  std::vector<Part> parts() const;

  std::int64_t mlp_ratio_;
  Precision inside_ = Precision::fp32;  // set_types
  Shape sample_;                        // (T, d)
  std::unique_ptr<LayerNorm> ln1_, ln2_;
  std::unique_ptr<Attention> attn_;
  std::unique_ptr<Linear> fc_, proj_;
  std::unique_ptr<Gelu> gelu_;
  // Forward's activations, kept for backward: a = ln_1(x), r = x + attention(a),
  // c = ln_2(r), f = fc(c), g = gelu(f); the attention's and proj's outputs are added
  // into r and y by their GEMMs' epilogues, never stored on their own (their backward
  // reads them not).
  Tensor a_, r_, c_, f_, g_;
  // Backward's gradients: w.r.t. f (proj's dx GEMM through the GELU's gradient: g's
  // is never stored), c, r (ln_2's part plus dy), a; their buffers backward's shared
  // slots (tensor.hpp), empty outside backward.
  Tensor df_, dc_, dr_, da_;
};

}  // namespace ddp
