#pragma once
// Serialised TensorBoard Event messages (protobuf), with no protobuf type in sight:
// this header is all that ddp_core sees of the library ddp_tensorboard.

#include <cstdint>
#include <string>

namespace ddp::tb {

// The first record of an events file: Event{wall_time, file_version = "brain.Event:2"}.
std::string version_event(double wall_time);
// Event{wall_time, step, session_log{status = START}}: a run (re)starts at `step`.
// TensorBoard then drops the events of steps >= `step` from the files before this
// one (its "orphaned data": PyTorch's SummaryWriter(purge_step=step) writes the same).
std::string session_start_event(double wall_time, std::int64_t step);
// Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value);

}  // namespace ddp::tb
