#pragma once
// Losses on the model output. Per-sample values, so the trainer can sum them over
// ranks (in double) and divide by the number of real (not padded) samples.

#include "model/tensor.hpp"

namespace ddp {

enum class LossKind { CrossEntropy, MSE };

// out: (B, C) logits (CrossEntropy) or predictions (MSE).
// labels: (B) class indices in [0, C), CrossEntropy only (a label outside gives a NaN loss).
// targets: (B, C) flat, MSE only.
// loss: (B) per-sample loss. CrossEntropy: logsumexp(out_b) - out_b[label_b], computed
// stably. MSE: mean over the sample's C elements of (out - target)^2, so the mean over
// samples equals torch.nn.MSELoss().
// correct: (B) 1 where argmax(out_b) (first maximum wins) == label_b, else 0;
// CrossEntropy only, MSE leaves it untouched (it may be an empty View).
// smoothing s (CrossEntropy only): torch.nn.CrossEntropyLoss(label_smoothing=s), the
// target (1 - s) on the label plus s / C on every class:
//   loss_b = logsumexp(out_b) - (1 - s) out_b[label_b] - s / C sum_c out_bc.
// s = 0 computes exactly what it computed without it.
// rows > 1 (CrossEntropy only; a language model's tokens): out is (B, rows, C) and
// labels (B rows), one label a row; a sample's loss and correct are the means over
// its rows of the rows' (sums in double, in row order), so the trainer's mean over
// samples is the mean over every token, as F.cross_entropy over (B T, C) with
// reduction 'mean'; its gradient is scale / rows on each row. rows = 1 is the above.
// row_scratch (rows > 1): row_scratch_floats(B, rows, C) floats the rows' values go
// through on their way to the means; short of them a buffer is allocated for the
// call, which a CUDA graph's capture does not allow: the trainer passes its own.
// lanes (rows > 1): how a row of C logits is read. 0: a thread a row (the host's way,
// the floats above); L > 0: L neighbouring threads a row, each every L-th logit, their
// statistics merged in lane order (the GPU's way: a warp reads neighbouring floats;
// the same formulas, sums in another fixed order, so other last bits); -1: row_lanes(C).
void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing = 0.0f, std::int64_t rows = 1, const View1& row_scratch = {},
                  std::int64_t lanes = -1);

// The build's lanes for rows of C logits: 0 on the host; on the GPU 32, 64 or 128
// (whole warps, at least 16 logits a lane), 0 below 512 logits.
std::int64_t row_lanes(std::int64_t C);

// The floats of row_scratch for B samples of rows rows of C logits (0 for one row).
std::size_t row_scratch_floats(std::int64_t B, std::int64_t rows, std::int64_t C, std::int64_t lanes = -1);

// dout (B, C) = scale * d(sum_b loss_b) / d out; dout is resized here. The trainer
// passes scale = 1 / (samples in the global step), so the sum over ranks of the
// gradients is the gradient of the mean loss.
void loss_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                   float scale, Tensor& dout, float smoothing = 0.0f, std::int64_t rows = 1);

// loss_forward and loss_backward in one kernel over the logits (a training step's
// loss: one launch and one read of the logits fewer); the same floats as the two,
// but where lanes > 0 (loss_backward reads a row a thread): then loss_forward's.
void loss_forward_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                           float scale, View1 loss, View1 correct, Tensor& dout, float smoothing = 0.0f,
                           std::int64_t rows = 1, const View1& row_scratch = {}, std::int64_t lanes = -1);

// Top-k accuracy's per-sample hits (validation: k = 5, ImageNet's second number).
// out: (B, C) logits; labels: (B); hits: (B) 1 where label_b is among the k classes
// ranked first, else 0 (a label outside [0, C), or a NaN logit on it, is no hit).
// Classes are ranked by logit, ties by index, lower first: the label's place is
//   #{c : out_bc > out_b,label} + #{c < label : out_bc == out_b,label},
// so k = 1 is loss_forward's `correct` (the first maximum wins) for finite logits.
// rows > 1: hits_b is the fraction of the sample's rows hit, as loss_forward's.
void top_k_hits(const Tensor& out, const LabelView& labels, std::int64_t k, View1 hits, std::int64_t rows = 1,
                const View1& row_scratch = {}, std::int64_t lanes = -1);

}  // namespace ddp
