#pragma once
// "205.1 MiB": a size in the lines that say what memory a run needs and has.

#include <cstdio>
#include <string>

namespace ddp {

inline std::string mib_text(double bytes) {
  char t[48];
  std::snprintf(t, sizeof t, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return t;
}

}  // namespace ddp
