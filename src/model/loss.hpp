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
// row_scratch (rows > 1): 2 B rows floats the rows' values go through on their way to
// the means (one thread a row, then one a sample); without them a buffer is allocated
// for the call, which a CUDA graph's capture does not allow: the trainer passes its own.
void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing = 0.0f, std::int64_t rows = 1,
                  const View1& row_scratch = {});

// dout (B, C) = scale * d(sum_b loss_b) / d out; dout is resized here. The trainer
// passes scale = 1 / (samples in the global step), so the sum over ranks of the
// gradients is the gradient of the mean loss.
void loss_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                   float scale, Tensor& dout, float smoothing = 0.0f, std::int64_t rows = 1);

// loss_forward and loss_backward in one kernel over the logits (a training step's
// loss: one launch and one read of the logits fewer); the same floats as the two.
void loss_forward_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                           float scale, View1 loss, View1 correct, Tensor& dout, float smoothing = 0.0f,
                           std::int64_t rows = 1, const View1& row_scratch = {});

// Top-k accuracy's per-sample hits (validation: k = 5, ImageNet's second number).
// out: (B, C) logits; labels: (B); hits: (B) 1 where label_b is among the k classes
// ranked first, else 0 (a label outside [0, C), or a NaN logit on it, is no hit).
// Classes are ranked by logit, ties by index, lower first: the label's place is
//   #{c : out_bc > out_b,label} + #{c < label : out_bc == out_b,label},
// so k = 1 is loss_forward's `correct` (the first maximum wins) for finite logits.
// rows > 1: hits_b is the fraction of the sample's rows hit, as loss_forward's.
void top_k_hits(const Tensor& out, const LabelView& labels, std::int64_t k, View1 hits, std::int64_t rows = 1,
                const View1& row_scratch = {});

}  // namespace ddp
