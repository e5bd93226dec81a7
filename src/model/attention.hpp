#pragma once
// attention(heads[, causal][, block=N][, fused]): multi-head self-attention, PyTorch's
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
// Two paths, the same arithmetic row by row; results within float rounding of each
// other, not the same bits (a GEMM's bits depend on its shape, and dK and dV are
// summed block by block), except that one block of all T gives the keep path's bits:
// - keep (block=0): every (batch, head) gets its (T, T) scores, and forward keeps
//   the probabilities P, B nh T^2 floats, for backward, which takes as many again for
//   dS while it runs.
// - blocks of query rows (block=N; N >= T: one block of all T): forward works one
//   block of N queries of one sample at a time and keeps only each row's softmax
//   statistics (its max and the reciprocal of its sum, 2 B nh T floats); backward
//   recomputes the block's scores and, from the statistics, the same bits of P. A
//   causal block of queries i0..i0+N-1 sees keys 0..i0+N-1 only, so the masked corner
//   past the block is neither computed nor stored. Memory: O(B nh T) kept plus one block's (nh, N, T)
//   scores and their gradient, for one extra GEMM a block in backward (the
//   recomputation flash attention makes too).
// The default: blocks of R rows where T > R, the keep path where T <= R; R is 128 on
// the host (faster than keeping P from T = 256 on, attention.cpp), and on a GPU the
// largest power of two up to 512 (at least 16) whose (nh, R, T) scores take at most
// 64 MiB. At B = 8, nh = 12, T = 4096 the keep path would hold 6.4 GB of P a layer
// (and as much again for dS in backward); the block path holds 3 MB of statistics
// and, on the GPU (R = 256), 96 MiB of scratch (p_ and ds_, shared by the layers:
// tensor.hpp's shared_scratch, as backward's dO and dQKV).
// Neither is a fused kernel: the blocks go through the gemm seam, on a GPU cuBLAS.
// - fused (the `fused` option): where the backend has it (the GPU build at bf16, head
//   sizes 16, 32, 64 and 128: cuda/flash_attention.hpp), flash attention's kernels between the
//   projections, keeping the block path's statistics and nothing of (T, T); elsewhere
//   the path above. Opt-in until it has run on a GPU: compiled, not run.
// The per-head products go through the gemm seam with leading dimensions that pick
// the head's columns out of the rows of qkv, so no head is copied: the keep path's
// products are one gemm_batched_groups of B samples by nh heads each (2 in forward, 4
// in backward), the block path's one a sample and block over the heads (2 and 5). On
// a GPU, strided-batched cuBLAS calls on operands narrowed once (one call per head
// over the samples; a loop over the samples was B calls of nh small products,
// launch-bound, at the cost of scratch for a whole qkv a narrowed operand); on
// the host a loop of oneDNN's sgemm, whose batched matmul was no faster at gpt_tiny's
// shapes. The softmax in fp32 with the row's max subtracted, its
// sums in double, a team thread per row; the bias gradients as column sums in double
// (not a GEMV: oneDNN's splits its sum between its threads). Every sum of the layer's
// own in an order fixed by the shapes: the same bits every run, on any number of
// ranks. Not on any number of oneDNN threads (DDP_DNNL_THREADS; 1 by default): with
// oneDNN capped at AVX2 its sgemm split sums between 2 threads, 414 of the 147,712
// floats of one step of attention(4, causal) at (64, 64) in other bits. NCHW
// activations, fp32 but where a transformer block keeps its inner activations narrow
// (set_types): x and dx, y and dy of that type, read and written by the projections'
// GEMMs as they are; qkv, O and the scores stay fp32. The GEMM operands in the layer's
// precision.

#include "model/layer.hpp"

namespace ddp {

class Attention : public Layer {
 public:
  // block: query rows a block (>= 1), 0 for the keep path, kAutoBlock for the rule above.
  static constexpr std::int64_t kAutoBlock = -1;
  Attention(std::int64_t heads, bool causal, std::int64_t block = kAutoBlock, bool fused = false)
      : heads_(heads), causal_(causal), block_(block), fused_(fused) {}

  std::string kind() const override { return "attention"; }
  std::int64_t heads() const { return heads_; }
  bool causal() const { return causal_; }
  // Query rows a block after output_shape (0: the keep path), from the option and (nh, T).
  std::int64_t block_rows() const { return rows_; }
  // Whether the fused kernels run at the layer's precision on this backend.
  bool runs_fused() const;
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  std::int64_t kept_floats(std::int64_t batch) const override;
  void scratch_floats(std::int64_t batch, SlotFloats& most) const override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  // y = add + attention(x): a residual sum in the output projection's epilogue (add
  // (B, T, d), fp32, as y). forward is it without a residual.
  void forward_adding(const Tensor& x, const Tensor* add, Tensor& y, bool training);
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // The types of x and dx (in), of y and dy (out): fp32 (the default), or the narrow
  // type of the layer's precision.
  void set_types(Precision in, Precision out) {
    in_type_ = in;
    out_type_ = out;
  }

 private:
  void scores(const float* qkv, std::int64_t b, std::int64_t i0, std::int64_t m, std::int64_t n, float* s,
              std::int64_t samples = 1) const;
  std::int64_t heads_;  // nh
  bool causal_;
  Precision in_type_ = Precision::fp32, out_type_ = Precision::fp32;  // set_types
  std::int64_t block_;                   // the option: kAutoBlock, 0 (keep) or rows
  bool fused_;                           // the option: the backend's fused kernels where it has them
  bool ran_fused_ = false;               // whether the last forward ran them (backward follows it)
  std::int64_t rows_ = 0;                // resolved by output_shape: 0 (keep) or rows a block
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
  // Grown only: a smaller batch uses a prefix.
  View1 qkv_;                      // (B, T, 3d): Q, K, V of forward, heads side by side in each
  View1 p_;                        // keep: (B, nh, T, T), the probabilities kept for backward;
                                   // blocks: (nh, N, T), one block's scores and probabilities
                                   // (a shared slot, held during forward and backward)
  View1 stats_;                    // blocks, fused: (B, nh, T, 2), each row's max and 1 / sum
  View1 o_;                        // (B, T, d): the heads' outputs, concatenated
  View1 do_;                       // (B, T, d): backward's gradient of o_
  View1 dqkv_;                     // (B, T, 3d): backward's gradient of qkv_
  View1 ds_;                       // as p_: backward's gradient of the scores; fused: (B, nh, T) scratch
                                   // (do_, dqkv_, ds_: shared slots, held during backward)
  Kokkos::View<double*> partial_;  // (K, 3d) the bias gradients' sums over K stretches of rows
};

}  // namespace ddp
