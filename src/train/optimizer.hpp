#pragma once
// Optimizers as torch.optim defines them, on the model's flat parameter and
// gradient buffers. The update is one Kokkos kernel over the default execution
// space, so it runs where the buffers live (host or GPU).

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/config.hpp"

namespace ddp {

class Optimizer {
 public:
  virtual ~Optimizer();

  // params (n) -= update(grad_scale * grads (n)) at learning rate lr; counts one
  // step. The trainer passes 1 / (global batch) as grad_scale: the gradients hold
  // per-sample sums, and scaling them here saves a pass over the buffer.
  virtual void step(Kokkos::View<float*> params, Kokkos::View<const float*> grads, double lr,
                    float grad_scale = 1.0f) = 0;
  virtual std::string name() const = 0;  // "SGD" | "AdamW"

  // State buffers by torch's names, for checkpoints: "momentum_buffer"; "exp_avg",
  // "exp_avg_sq". Each holds the owned range of the flat buffer (all n floats but
  // under ZeRO). Writing into them restores the state.
  virtual std::vector<std::pair<std::string, Kokkos::View<float*>>> state() = 0;

  // The range [offset, offset + size) of the flat buffers this optimizer updates and
  // keeps state for: everything, or under ZeRO this rank's share (comm/shares.hpp).
  struct Range {
    std::int64_t offset = 0, size = 0;
  };
  Range owned() const { return owned_; }

  std::int64_t steps() const { return steps_; }           // steps taken (AdamW's t before the next one)
  void set_steps(std::int64_t steps) { steps_ = steps; }  // on resume, with state()

 protected:
  std::int64_t steps_ = 0;
  Range owned_;
};

// cfg.optimizer picks the rule ('sgd' | 'adamw'); n_params sizes the state buffers.
// no_decay: the [offset, offset + size) ranges of the flat buffer that weight decay
// leaves alone (train.decay_norm_and_bias = F: the 1-D tensors), as a second
// torch.optim parameter group with weight_decay 0 would.
struct ParamRange {
  std::int64_t offset, size;
};
// owned: the range it updates (ZeRO's share); size -1: all n_params. step() still
// takes the whole buffers and reads and writes that range of them only.
// How many buffers of the owned share state() holds: SGD 0, or 1 with momentum; AdamW 2.
int optimizer_state_copies(const TrainConfig& cfg);

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& cfg, std::size_t n_params,
                                          const std::vector<ParamRange>& no_decay = {},
                                          ParamRange owned = {0, -1});

}  // namespace ddp
