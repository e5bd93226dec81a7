#pragma once
// This process's host memory, from Linux's /proc/self/status.

#include <cstdint>

namespace ddp {

// In bytes: peak is VmHWM (the largest resident set so far), resident VmRSS (now);
// -1 where the file or the field is missing.
struct HostMemory {
  std::int64_t peak = -1, resident = -1;
};
HostMemory host_memory();

}  // namespace ddp
