#pragma once
// Shared by the trainer's sources: trainer.cpp (construction, resume, checkpoints,
// fit), trainer_epoch.cpp (the epoch loop, validation), trainer_step.cpp (the
// reduction, the step's checks and the optimizer step).

#include <chrono>

namespace ddp::trainer_detail {

// Seconds on the steady clock: timings and the checkpoint time cadence.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ddp::trainer_detail
