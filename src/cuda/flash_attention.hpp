#pragma once
// Fused multi-head self-attention on the GPU, flash attention's algorithm (Dao et
// al., FlashAttention-2): per (sample, head), tiles of 64 queries against tiles of
// 64 keys in shared memory, the softmax online (a running max and sum per query),
// so no (T, T) matrix is ever in global memory: O(T) memory per head. Q, K, V and
// dO are read as the layer keeps them (fp32) and rounded to bf16 in shared memory;
// the products on the tensor cores (WMMA 16x16x16, bf16 operands, fp32 sums; the
// tiles' rows padded in shared memory so that WMMA's loads and stores meet no bank
// conflicts; rows read 4 floats at a time where they lie on 16 bytes); the
// softmax and its statistics in fp32. Backward recomputes the probabilities from
// forward's statistics in two kernels, one per key tile (dK, dV) and one per query
// tile (dQ): no atomics, so every sum's order is fixed by the shapes (the same bits
// every run). Head sizes 16, 32, 64 and 128; sm_80 or later (bf16 WMMA: in a build
// for older GPUs too, the kernels are empty there and never chosen). Stream-ordered,
// no host waits, no allocation: capturable in a CUDA graph.
//
// Layouts (the attention layer's, model/attention.hpp), d = heads x head size:
//   qkv  (B, T, 3d): Q of head h at columns h hs, K at d + h hs, V at 2d + h hs
//   o, dO (B, T, d): head h at columns h hs
//   stats (B, heads, T, 2): each query row's max m of its scores and 1 / sum, so that
//         P = exp(s - m) / sum, s = q.k / sqrt(hs) (the block path's statistics)
//   delta (B, heads, T): backward's scratch, dO . O per query row
//   dqkv (B, T, 3d): dQ, dK, dV, written (not added to)

#include <cuda_runtime.h>

#include <cstdint>

namespace ddp::cuda {

struct AttentionDims {
  std::int64_t B, T, heads, head_size;
  bool causal;
};

// Whether the kernels run here for this head size: 16, 32, 64 or 128, a binary for
// sm_80 or later in the build for this GPU, and its shared memory per block enough for
// the size's kernels (head size 128 needs 147 KiB: not on sm_86, sm_89, sm_120's 99).
bool flash_attention_supported(std::int64_t head_size);

void flash_attention_forward(const AttentionDims& a, const float* qkv, float* o, float* stats,
                             cudaStream_t stream);

void flash_attention_backward(const AttentionDims& a, const float* qkv, const float* o, const float* d_o,
                              const float* stats, float* delta, float* dqkv, cudaStream_t stream);

}  // namespace ddp::cuda
