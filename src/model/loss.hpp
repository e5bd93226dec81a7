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
void loss_forward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets, View1 loss,
                  View1 correct, float smoothing = 0.0f);

// dout (B, C) = scale * d(sum_b loss_b) / d out; dout is resized here. The trainer
// passes scale = 1 / (samples in the global step), so the sum over ranks of the
// gradients is the gradient of the mean loss.
void loss_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                   float scale, Tensor& dout, float smoothing = 0.0f);

// loss_forward and loss_backward in one kernel over the logits (a training step's
// loss: one launch and one read of the logits fewer); the same floats as the two.
void loss_forward_backward(LossKind kind, const Tensor& out, const LabelView& labels, const View1& targets,
                           float scale, View1 loss, View1 correct, Tensor& dout, float smoothing = 0.0f);

}  // namespace ddp
