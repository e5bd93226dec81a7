#pragma once
// JSON text written by hand (metrics.jsonl, the timeline of io.trace): one escaper.

#include <string>

namespace ddp {

// s as a JSON string literal, quotes included: '"', '\' and control characters escaped.
std::string json_string(const std::string& s);

}  // namespace ddp
