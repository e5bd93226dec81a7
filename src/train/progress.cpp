#include "train/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ddp {

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0) return "?";
  char buf[32];
  if (seconds < 9.95) {  // short runs (tests, a last epoch) still show a change
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
    return buf;
  }
  const long long s = std::llround(seconds);
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else {
    const long long m = (s + 30) / 60;  // to the nearest minute
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", m / 60, m % 60);
  }
  return buf;
}

RunEta::RunEta(std::int64_t epochs, std::int64_t epoch_positions, std::int64_t val_samples)
    : epochs_(epochs), epoch_positions_(epoch_positions), val_samples_(val_samples) {}

void RunEta::trained(double seconds, std::int64_t positions) {
  if (seconds > 0.0 && positions > 0) {
    train_seconds_ += seconds;
    train_positions_ += double(positions);
  }
}

void RunEta::validated(double seconds) { val_seconds_ = std::max(seconds, 0.0); }

double RunEta::rate() const { return train_seconds_ > 0.0 ? train_positions_ / train_seconds_ : 0.0; }

double RunEta::validation_seconds() const {
  if (val_samples_ == 0) return 0.0;
  // Before the first: forward only, about a third of a training step's work per sample.
  return val_seconds_ >= 0.0 ? val_seconds_ : double(val_samples_) / (3.0 * rate());
}

double RunEta::epoch_left(std::int64_t epoch, std::int64_t consumed) const {
  if (epoch >= epochs_) return 0.0;
  const double r = rate();
  if (!(r > 0.0)) return std::nan("");
  const double left = double(std::max<std::int64_t>(epoch_positions_ - consumed, 0));
  return left / r + validation_seconds();
}

double RunEta::run_left(std::int64_t epoch, std::int64_t consumed) const {
  if (epoch >= epochs_) return 0.0;
  const double r = rate();
  if (!(r > 0.0)) return std::nan("");
  const double whole = double(epoch_positions_) / r + validation_seconds();
  return epoch_left(epoch, consumed) + double(epochs_ - epoch - 1) * whole;
}

}  // namespace ddp
