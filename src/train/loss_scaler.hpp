#pragma once
// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler: the loss is
// multiplied by scale() before backward so that small gradients survive fp16; the
// gradients are multiplied by 1/scale() before the optimizer step. A step whose
// gradients hold an inf or NaN on ANY rank is skipped on every rank and the scale
// is multiplied by backoff_factor; after growth_interval clean steps in a row it is
// multiplied by growth_factor (never past the largest float). Device-independent:
// a Kokkos reduction over the gradients and one all-reduce of a flag.

#include "comm/communicator.hpp"
#include "model/tensor.hpp"

namespace ddp {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  float scale() const { return float(scale_); }
  int clean_steps() const { return clean_steps_; }  // since the last growth or overflow

  // The whole step's check, collective: looks for inf/NaN in this rank's `grads`,
  // agrees with the other ranks, and then either unscales `grads` in place and
  // returns true (take the optimizer step) or returns false (skip it, on every rank).
  // Updates the scale either way.
  bool unscale_and_check(Communicator& comm, View1 grads);

  // The pieces, for callers with gradients in several buffers:
  static bool has_inf_or_nan(ConstView1 grads);  // this rank only
  // True when any rank's `local_overflow` is true. Collective over `comm`, the
  // gradients' communicator (it is handed a one-element buffer in the default
  // memory space, like the gradients).
  static bool any_rank(Communicator& comm, bool local_overflow);
  void unscale(View1 grads) const;  // grads *= 1/scale (exact for a power-of-two scale)
  void update(bool overflow);       // the schedule above
  // Continue a schedule saved in a checkpoint.
  void restore(double scale, int clean_steps);

 private:
  LossScalerOptions options_;
  double scale_;
  int clean_steps_ = 0;
};

}  // namespace ddp
