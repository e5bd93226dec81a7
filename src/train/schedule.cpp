#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "comm/check.hpp"

namespace ddp {

double learning_rate(const TrainConfig& cfg, std::int64_t step, std::int64_t steps_per_epoch,
                     double plateau_lr) {
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
  if (cfg.schedule == "plateau") return plateau_lr > 0 ? plateau_lr : cfg.lr;
  throw InputError("train.schedule = '" + cfg.schedule +
                   "': expected one of 'constant', 'step', 'multistep', 'cosine', 'plateau'");
}

std::int64_t plateau_step(TrainingState& pos, const TrainConfig& cfg, double value, bool lower) {
  const double t = cfg.plateau_threshold;
  const bool better = std::isfinite(value) &&
                      (pos.plateau_epoch == 0 ||
                       (lower ? value < pos.plateau_best * (1 - t) : value > pos.plateau_best * (1 + t)));
  if (better) {
    pos.plateau_best = value;
    pos.plateau_epoch = pos.epoch;
    pos.plateau_bad_epochs = 0;
  } else {
    ++pos.plateau_bad_epochs;
  }
  if (pos.plateau_cooldown > 0) {  // bad epochs in cooldown are not counted
    --pos.plateau_cooldown;
    pos.plateau_bad_epochs = 0;
  }
  if (pos.plateau_bad_epochs <= cfg.plateau_patience) return 0;
  const std::int64_t bad = pos.plateau_bad_epochs;
  const double rate = pos.plateau_lr > 0 ? pos.plateau_lr : cfg.lr;
  const double reduced = std::max(rate * cfg.gamma, cfg.min_lr);
  pos.plateau_cooldown = cfg.plateau_cooldown;
  pos.plateau_bad_epochs = 0;
  if (!(rate - reduced > 1e-8)) return 0;
  pos.plateau_lr = reduced;
  return bad;
}

}  // namespace ddp
