#include "model/kernel_trace.hpp"

#include <Kokkos_Core.hpp>

namespace ddp::kernel_trace {

namespace {
bool g_on = false;
std::vector<Kernel> g_kernels;
bool g_counting = false;
Dispatches g_counts;

namespace tools = Kokkos::Tools::Experimental;

void count_kernel(const char* label, std::uint32_t, std::uint64_t*) {
  ++g_counts.kokkos;
  ++g_counts.kernels[label ? label : "?"];
}
void count_copy(Kokkos::Profiling::SpaceHandle, const char*, const void*, Kokkos::Profiling::SpaceHandle,
                const char*, const void*, std::uint64_t) {
  ++g_counts.copies;
}

void set_callbacks(bool on) {
  tools::set_begin_parallel_for_callback(on ? count_kernel : nullptr);
  tools::set_begin_parallel_reduce_callback(on ? count_kernel : nullptr);
  tools::set_begin_parallel_scan_callback(on ? count_kernel : nullptr);
  tools::set_begin_deep_copy_callback(on ? count_copy : nullptr);
}
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

void start_counting() {
  g_counts = {};
  g_counting = true;
  set_callbacks(true);
}

Dispatches stop_counting() {
  set_callbacks(false);
  g_counting = false;
  return g_counts;
}

void count_library_call() {
  if (g_counting) ++g_counts.library;
}

void count_cuda_launch() {
  if (g_counting) ++g_counts.cuda;
}

void count_graph_launch() {
  if (g_counting) ++g_counts.graphs;
}

bool counting() { return g_counting; }

}  // namespace ddp::kernel_trace
