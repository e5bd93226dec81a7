#pragma once
// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_(params, max_norm)
// with norm_type 2 (PyTorch 1.13 and 2.x alike):
//
//   total_norm = ||(||g_1||, ..., ||g_k||)||    (= the 2-norm of every gradient at once)
//   clip_coef  = max_norm / (total_norm + 1e-6)
//   g_j       *= min(clip_coef, 1)              (always multiplied, by 1.0 when not clipping)
//
// The squared norm is summed in blocks of kShareAlign floats (comm/shares.hpp), each
// block's sum in a fixed order, and the block sums added in block order on the host:
// the same bits whatever holds the gradients. Under plain data parallelism and ZeRO
// stage 1 every rank holds the whole reduced buffer and sums every block; at stage 2
// a rank holds its share's sums only, sums its share's blocks, and the block sums are
// all-gathered (share boundaries are block boundaries). So clipping leaves the
// stages bitwise equal.

#include <cstdint>
#include <vector>

#include "model/tensor.hpp"

namespace ddp {

// For each block k of kShareAlign floats in [begin, end) (begin a multiple of
// kShareAlign, end a multiple or the buffer's end): the sum over its i of
// (grads(i) * scale)^2, where each product is rounded to float first (the gradient
// the optimizer reads, scaled by the same float) and squared and summed in double
// (no overflow from any float gradient: the sum is non-finite exactly when some
// gradient is). One labelled Kokkos kernel over the default execution space; the
// sums are copied to the host. Deterministic: no thread count or schedule enters.
// scratch: where the kernel writes the sums, grown here when short and kept by the
// caller from step to step (on a GPU a View made per step is a cudaMalloc and a
// device-wide cudaFree per step).
std::vector<double> grad_block_sums(ConstView1 grads, std::int64_t begin, std::int64_t end, float scale,
                                    Kokkos::View<double*>& scratch);

// The block sums added in order: the squared total norm.
double sum_in_order(const std::vector<double>& block_sums);

// min(max_norm / (norm + 1e-6), 1): PyTorch's clip_coef_clamped, in double.
double clip_coefficient(double norm, double max_norm);

}  // namespace ddp
