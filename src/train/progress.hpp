#pragma once
// The numbers of a progress line that are about time: samples/s and the time left
// for the epoch and for the run. Each rank keeps its own clock; rank 0's is printed.
//
// The rate is every training position measured in this process (all ranks' samples,
// padding included, as in the epoch line's samples/s) over the seconds they took,
// validation excluded: a resumed run measures only itself, and its time left counts
// only the positions still to train. Validation counts as long as the last one
// measured; before the first, as the validation samples at three times the training
// rate (forward only: about a third of a training step's work per sample).

#include <cstdint>
#include <string>

namespace ddp {

// "0.4s" (below 10 s), "42s", "3m12s", "2h05m"; "?" when not finite or negative.
std::string duration_text(double seconds);

class RunEta {
 public:
  // epochs: train.epochs; epoch_positions: the sampler's global positions per epoch
  // (padded); val_samples: the validation set (0: none).
  RunEta() = default;
  RunEta(std::int64_t epochs, std::int64_t epoch_positions, std::int64_t val_samples);

  void trained(double seconds, std::int64_t positions);  // a measured span of training
  void validated(double seconds);                        // a measured validation

  // Positions per second of training so far; 0 before any measurement.
  double rate() const;
  // Seconds until the line of epoch `epoch` (0-based) when `consumed` of its
  // positions are trained: the rest of its training and its validation. NaN before
  // a measurement.
  double epoch_left(std::int64_t epoch, std::int64_t consumed) const;
  // Seconds until the run's end from there (0 when `epoch` >= epochs).
  double run_left(std::int64_t epoch, std::int64_t consumed) const;

 private:
  double validation_seconds() const;

  std::int64_t epochs_ = 0, epoch_positions_ = 0, val_samples_ = 0;
  double train_seconds_ = 0.0;
  double train_positions_ = 0.0;
  double val_seconds_ = -1.0;  // the last validation's; < 0: none measured yet
};

}  // namespace ddp
