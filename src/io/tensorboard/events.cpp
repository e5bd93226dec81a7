#include "io/tensorboard/events.hpp"

#include "event.pb.h"

namespace ddp::tb {

std::string version_event(double wall_time) {
  Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  return e.SerializeAsString();
}

std::string session_start_event(double wall_time, std::int64_t step) {
  Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  e.mutable_session_log()->set_status(SessionLog::START);
  return e.SerializeAsString();
}

std::string scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value) {
  Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  return e.SerializeAsString();
}

}  // namespace ddp::tb
