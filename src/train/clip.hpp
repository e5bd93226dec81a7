#pragma once
// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_(params, max_norm)
// with norm_type 2 (PyTorch 1.13 and 2.x alike):
//
//   total_norm = ||(||g_1||, ..., ||g_k||)||    (= the 2-norm of every gradient at once)
//   clip_coef  = max_norm / (total_norm + 1e-6)
//   g_j       *= min(clip_coef, 1)              (always multiplied, by 1.0 when not clipping)
//
// The norm is a sum of squares over ranges of the flat gradient buffer: under
// today's data parallelism every rank holds the whole reduced buffer and sums all of
// it; a rank holding a share of it sums its share, and the partial sums are
// all-reduced before the square root.

#include <cstddef>

#include "model/tensor.hpp"

namespace ddp {

// sum over i in [begin, end) of (grads(i) * scale)^2, where each product is rounded
// to float first (the gradient the optimizer reads, scaled by the same float) and
// squared and summed in double. One labelled Kokkos reduction over the default
// execution space; the same buffer and thread count give the same bits, so ranks
// holding the same gradients agree without a collective.
double grad_sum_of_squares(ConstView1 grads, std::size_t begin, std::size_t end, float scale);

// min(max_norm / (norm + 1e-6), 1): PyTorch's clip_coef_clamped, in double.
double clip_coefficient(double norm, double max_norm);

}  // namespace ddp
