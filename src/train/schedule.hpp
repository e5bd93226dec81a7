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

#include <cstdint>

#include "train/config.hpp"

namespace ddp {

double learning_rate(const TrainConfig& cfg, std::int64_t step, std::int64_t steps_per_epoch);

}  // namespace ddp
