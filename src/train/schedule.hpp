#pragma once
// Learning-rate schedules, as a pure function of the optimizer step.
//
// step: 0-based index of the optimizer step about to be taken;
// steps_per_epoch: optimizer steps per epoch (micro-steps / accumulation_steps);
// total = epochs * steps_per_epoch.
//
//   warm-up   (any schedule, warmup_steps > 0, step < warmup_steps):
//             lr * (step + 1) / warmup_steps      -- never 0, reaches lr at its last step
//   constant: lr
//   step:     lr * gamma^floor(epoch / step_epochs),  epoch = step / steps_per_epoch
//   multistep: lr * gamma^(milestones <= epoch), as torch.optim.lr_scheduler.MultiStepLR
//             stepped once an epoch
//   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2,
//             t = step - warmup_steps, T = total - warmup_steps (t clamped to [0, T];
//             T <= 0 gives lr)
//   plateau:  plateau_lr (lr until a reduction), set by plateau_step at validations

#include <cstdint>

#include "io/checkpoint.hpp"
#include "train/config.hpp"

namespace ddp {

double learning_rate(const TrainConfig& cfg, std::int64_t step, std::int64_t steps_per_epoch,
                     double plateau_lr = 0.0);

// train.schedule = 'plateau', after a validation whose train.plateau_metric is `value`
// (`lower`: val_loss, lower is better), as torch.optim.lr_scheduler.ReduceLROnPlateau's
// step(value) in its 'rel' threshold mode: better where it beats the best so far by more
// than plateau_threshold of it (the first finite value always); more than
// plateau_patience epochs not better (cooldown epochs count neither way) reduce the rate
// to max(rate * gamma, min_lr), then plateau_cooldown epochs of cooldown. The position
// is pos.plateau_* (pos.epoch: the epochs done, this one's included). Returns the epochs
// not better that made a reduction (0: none made; a reduction of less than 1e-8, at
// min_lr, is none, as PyTorch's eps).
std::int64_t plateau_step(TrainingState& pos, const TrainConfig& cfg, double value, bool lower);

}  // namespace ddp
