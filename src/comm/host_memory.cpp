#include "comm/host_memory.hpp"

#include <cstdio>

namespace ddp {

HostMemory host_memory() {
  HostMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.peak = kb * 1024;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.resident = kb * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace ddp
