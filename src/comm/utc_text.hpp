#pragma once
// A time for a message, as the lock file and the data checks print it.

#include <ctime>
#include <string>

namespace ddp {

// "2026-11-29 04:10:30 UTC"
inline std::string utc_text(std::time_t t) {
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

}  // namespace ddp
