#pragma once
// attention(heads[, causal]): multi-head self-attention, PyTorch's
// nn.MultiheadAttention(d, heads, bias=True, batch_first=True) called as mha(x, x, x)
// with dropout 0, and with `causal` attn_mask the causal mask (-inf above the
// diagonal: token i attends to tokens 0..i), as GPT-2's attention:
//   qkv = x W_in^T + b_in                     (B, T, d) -> (B, T, 3d)
//   P_h = softmax(Q_h K_h^T / sqrt(hs))       per head h, (T, T), hs = d / heads
//   O_h = P_h V_h                             (B, nh, T, hs) -> concat (B, T, d)
//   y   = O W_out^T + b_out                   (B, T, d)
// A sequence sample (T, d) in and out, d a multiple of heads. Parameters in
// nn.MultiheadAttention's names and layouts: in_proj_weight (3d, d) (W_q, W_k, W_v
// stacked by rows), in_proj_bias (3d), out_proj.weight (d, d), out_proj.bias (d);
// its initialisation: xavier_uniform_ on in_proj_weight, nn.Linear's
// kaiming_uniform_(a=sqrt(5)) on out_proj.weight, zeros on both biases.
//
// The plain path, the naive T x T one: every (batch, head) gets its (T, T) scores.
// Memory: forward keeps P, B nh T^2 floats, for backward, and backward takes as many
// again for dS while it runs: at B = 8, nh = 12, T = 1024 that is 0.4 GB kept plus
// 0.4 GB in backward, at T = 4096 16 times that; so a few thousand tokens is the
// limit of this path (an O(T) fused one, flash or cuDNN SDPA, is a later task).
// The per-head products go through the gemm seam with leading dimensions that pick
// the head's columns out of the rows of qkv, so no head is copied: per batch one
// gemm_batched over the nh heads (2 products in forward, 4 in backward), one
// strided-batched cuBLAS call on a GPU (a loop of oneDNN's sgemm on the host, whose
// batched matmul was no faster at gpt_tiny's shapes). The softmax in fp32 with the row's max subtracted, its
// sums in double, a team thread per row; the bias gradients as column sums in double
// (not a GEMV: oneDNN's splits its sum between its threads). Every sum of the layer's
// own in an order fixed by the shapes: the same bits every run, on any number of
// ranks. Not on any number of oneDNN threads (DDP_DNNL_THREADS; 1 by default): with
// oneDNN capped at AVX2 its sgemm split sums between 2 threads, 414 of the 147,712
// floats of one step of attention(4, causal) at (64, 64) in other bits. fp32 NCHW
// activations (never planned narrow); the GEMM operands in the layer's precision.

#include "model/layer.hpp"

namespace ddp {

class Attention : public Layer {
 public:
  Attention(std::int64_t heads, bool causal) : heads_(heads), causal_(causal) {}

  std::string kind() const override { return "attention"; }
  std::int64_t heads() const { return heads_; }
  bool causal() const { return causal_; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t heads_;  // nh
  bool causal_;
  std::int64_t T_ = 0, d_ = 0, hs_ = 0;  // tokens, width, head size d / nh
  Shape sample_;                         // (T, d)
  float* in_weight_ = nullptr;           // (3d, d)
  float* in_bias_ = nullptr;             // (3d)
  float* out_weight_ = nullptr;          // (d, d)
  float* out_bias_ = nullptr;            // (d)
  float* din_weight_ = nullptr;          // (3d, d)
  float* din_bias_ = nullptr;            // (3d)
  float* dout_weight_ = nullptr;         // (d, d)
  float* dout_bias_ = nullptr;           // (d)
  // Grown only: a smaller batch uses a prefix. qkv_ and do_ hold one row more than
  // they use (see reserve_buffers in attention.cpp).
  View1 qkv_;                      // (B, T, 3d): Q, K, V of forward, heads side by side in each
  View1 p_;                        // (B, nh, T, T): the probabilities, kept for backward
  View1 o_;                        // (B, T, d): the heads' outputs, concatenated
  View1 do_;                       // (B, T, d): backward's gradient of o_
  View1 dqkv_;                     // (B, T, 3d): backward's gradient of qkv_
  View1 ds_;                       // (B, nh, T, T): backward's gradient of the scores
  Kokkos::View<double*> partial_;  // (K, 3d) the bias gradients' sums over K stretches of rows
};

}  // namespace ddp
