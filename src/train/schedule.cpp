#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "comm/check.hpp"

namespace ddp {

double learning_rate(const TrainConfig& cfg, std::int64_t step, std::int64_t steps_per_epoch) {
  if (steps_per_epoch < 1)
    throw InputError("learning_rate: steps_per_epoch = " + std::to_string(steps_per_epoch) +
                     ": must be >= 1 (fewer samples than one optimizer step?)");
  const std::int64_t warmup = cfg.warmup_steps;
  if (step < warmup) return cfg.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);

  if (cfg.schedule == "step") {
    const std::int64_t epoch = step / steps_per_epoch;
    return cfg.lr * std::pow(cfg.gamma, static_cast<double>(epoch / cfg.step_epochs));
  }
  if (cfg.schedule == "multistep") {
    const std::int64_t epoch = step / steps_per_epoch;
    const auto passed =
        std::upper_bound(cfg.milestones.begin(), cfg.milestones.end(), epoch) - cfg.milestones.begin();
    return cfg.lr * std::pow(cfg.gamma, static_cast<double>(passed));
  }
  if (cfg.schedule == "cosine") {
    const std::int64_t total = static_cast<std::int64_t>(cfg.epochs) * steps_per_epoch;
    const double pi = std::acos(-1.0);
    const double T = static_cast<double>(total - warmup);
    if (T <= 0) return cfg.lr;
    const double t = std::clamp(static_cast<double>(step - warmup), 0.0, T);
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1.0 + std::cos(pi * t / T)) / 2.0;
  }
  if (cfg.schedule == "constant") return cfg.lr;
  throw InputError("train.schedule = '" + cfg.schedule +
                   "': expected one of 'constant', 'step', 'multistep', 'cosine'");
}

}  // namespace ddp
