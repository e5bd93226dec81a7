#include "model/kernel_trace.hpp"

namespace ddp::kernel_trace {

namespace {
bool g_on = false;
std::vector<Kernel> g_kernels;
}  // namespace

void start() {
  g_kernels.clear();
  g_on = true;
}

bool recording() { return g_on; }

void record(Kernel kernel) {
  if (g_on) g_kernels.push_back(std::move(kernel));
}

std::vector<Kernel> stop() {
  g_on = false;
  return std::move(g_kernels);
}

}  // namespace ddp::kernel_trace
