#include "model/kernel_trace.hpp"

#include <Kokkos_Core.hpp>
#include <chrono>
#include <mutex>
#include <unordered_map>

namespace ddp::kernel_trace {

namespace {
bool g_on = false;
std::vector<Kernel> g_kernels;
bool g_counting = false;
bool g_timing = false;
Dispatches g_counts;

// A timed count's kernels under way, by the id Kokkos hands back at their end: label
// and start. Kernels may start from the loader's thread as well.
using Clock = std::chrono::steady_clock;
std::mutex g_mutex;
std::uint64_t g_next_id = 0;
std::unordered_map<std::uint64_t, std::pair<std::string, Clock::time_point>> g_running;

namespace tools = Kokkos::Tools::Experimental;

// Kokkos has fenced before this begin and fences again before the end.
void count_kernel(const char* label, std::uint32_t, std::uint64_t* id) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  const std::string name = label ? label : "?";
  ++g_counts.kokkos;
  ++g_counts.kernels[name];
  if (!g_timing) return;
  *id = ++g_next_id;
  g_running[*id] = {name, Clock::now()};
}
void end_kernel(std::uint64_t id) {
  const Clock::time_point now = Clock::now();
  const std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_running.find(id);
  if (it == g_running.end()) return;
  g_counts.kernel_seconds[it->second.first] += std::chrono::duration<double>(now - it->second.second).count();
  g_running.erase(it);
}
void count_copy(Kokkos::Profiling::SpaceHandle, const char*, const void*, Kokkos::Profiling::SpaceHandle,
                const char*, const void*, std::uint64_t) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts.copies;
}

void set_callbacks(bool on, bool timed) {
  tools::set_begin_parallel_for_callback(on ? count_kernel : nullptr);
  tools::set_begin_parallel_reduce_callback(on ? count_kernel : nullptr);
  tools::set_begin_parallel_scan_callback(on ? count_kernel : nullptr);
  tools::set_end_parallel_for_callback(on && timed ? end_kernel : nullptr);
  tools::set_end_parallel_reduce_callback(on && timed ? end_kernel : nullptr);
  tools::set_end_parallel_scan_callback(on && timed ? end_kernel : nullptr);
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

namespace {
double sum_of(const std::map<std::string, double>& seconds) {
  double sum = 0.0;
  for (const auto& [label, s] : seconds) sum += s;
  return sum;
}
thread_local bool t_timing_call = false;  // a Timed of this thread is timing
}  // namespace

double Dispatches::kernel_seconds_total() const { return sum_of(kernel_seconds); }
double Dispatches::call_seconds_total() const { return sum_of(call_seconds); }

Timed::Timed(const char* what, const char* detail) {
  if (!g_timing || t_timing_call) return;
  t_timing_call = true;
  label_ = *detail ? std::string(what) + " " + detail : std::string(what);
  Kokkos::fence();
  start_ = Clock::now();
}

Timed::~Timed() {
  if (label_.empty()) return;
  Kokkos::fence();
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  t_timing_call = false;
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_timing) return;
  g_counts.call_seconds[label_] += seconds;
  ++g_counts.calls[label_];
}

Timed cuda_launch(const char* what, const char* detail) {
  if (g_counting) ++g_counts.cuda;
  return Timed(what, detail);
}

void start_counting(bool timed) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_counts = {};
  g_running.clear();
  g_counting = true;
  g_timing = timed;
  set_callbacks(true, timed);
}

Dispatches stop_counting() {
  set_callbacks(false, false);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_counting = false;
  g_timing = false;
  return g_counts;
}

void count_library_call() {
  if (g_counting) ++g_counts.library;
}

void count_graph_launch() {
  if (g_counting) ++g_counts.graphs;
}

bool counting() { return g_counting; }

}  // namespace ddp::kernel_trace
