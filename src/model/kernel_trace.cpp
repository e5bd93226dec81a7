#include "model/kernel_trace.hpp"

#include <Kokkos_Core.hpp>
#include <chrono>
#include <mutex>
#include <unordered_map>

#if defined(KOKKOS_ENABLE_CUDA)  // defined by the Kokkos header above
#include "cuda/cuda_check.hpp"
#endif

namespace ddp::kernel_trace {

namespace {
bool g_on = false;
std::vector<Kernel> g_kernels;
bool g_counting = false;
bool g_timing = false;
Dispatches g_counts;

// A fenced count's kernels under way, by the id Kokkos hands back at their end: label
// and start. Kernels may start from the loader's thread as well.
using Clock = std::chrono::steady_clock;
std::mutex g_mutex;
std::uint64_t g_next_id = 0;
std::unordered_map<std::uint64_t, std::pair<std::string, Clock::time_point>> g_running;

#if defined(KOKKOS_ENABLE_CUDA)
// A device-timed count: an event on the compute stream before and after each kernel
// and call, read when the count stops or when many have gathered (a read waits for
// the stream). Events are made once and reused.
bool g_device_timing = false;
cudaStream_t g_stream = nullptr;
std::vector<cudaEvent_t> g_free_events;
struct Span {
  std::string label;
  bool call;  // a library call or own CUDA kernel (Timed), else a Kokkos kernel
  cudaEvent_t start, stop;
};
std::vector<Span> g_spans;                             // ended, not yet read
std::unordered_map<std::uint64_t, Span> g_open_spans;  // Kokkos kernels begun, by id
constexpr std::size_t kSpansBeforeRead = 16384;        // ResNet-50: about 840 a step

cudaEvent_t recorded_event() {
  cudaEvent_t e;
  if (g_free_events.empty()) {
    CUDA_CHECK(cudaEventCreate(&e));
  } else {
    e = g_free_events.back();
    g_free_events.pop_back();
  }
  CUDA_CHECK(cudaEventRecord(e, g_stream));
  return e;
}

// Adds the ended spans' times (the stream runs them in order: the last one's end
// covers all) and frees their events. Holds g_mutex.
void read_spans() {
  if (g_spans.empty()) return;
  CUDA_CHECK(cudaEventSynchronize(g_spans.back().stop));
  for (const Span& span : g_spans) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, span.start, span.stop));
    (span.call ? g_counts.call_seconds : g_counts.kernel_seconds)[span.label] += 1e-3 * double(ms);
    if (span.call) ++g_counts.calls[span.label];
    g_free_events.push_back(span.start);
    g_free_events.push_back(span.stop);
  }
  g_spans.clear();
}

void end_span(Span span) {
  span.stop = recorded_event();
  g_spans.push_back(std::move(span));
  if (g_spans.size() >= kSpansBeforeRead) read_spans();
}

bool on_device(std::uint32_t device_id) {
  return Kokkos::Tools::Experimental::identifier_from_devid(device_id).type ==
         Kokkos::Tools::Experimental::DeviceType::Cuda;
}
#endif

namespace tools = Kokkos::Tools::Experimental;

// Fenced: Kokkos has fenced before this begin and fences again before the end.
void count_kernel(const char* label, std::uint32_t device_id, std::uint64_t* id) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  const std::string name = label ? label : "?";
  ++g_counts.kokkos;
  ++g_counts.kernels[name];
  if (!g_timing) return;
  *id = ++g_next_id;
#if defined(KOKKOS_ENABLE_CUDA)
  if (g_device_timing) {
    if (on_device(device_id)) g_open_spans[*id] = {name, false, recorded_event(), nullptr};
    return;
  }
#else
  (void)device_id;
#endif
  g_running[*id] = {name, Clock::now()};
}
void end_kernel(std::uint64_t id) {
  const Clock::time_point now = Clock::now();
  const std::lock_guard<std::mutex> lock(g_mutex);
#if defined(KOKKOS_ENABLE_CUDA)
  if (g_device_timing) {
    const auto open = g_open_spans.find(id);
    if (open == g_open_spans.end()) return;
    end_span(std::move(open->second));
    g_open_spans.erase(open);
    return;
  }
#endif
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
#if defined(KOKKOS_ENABLE_CUDA)
  if (g_device_timing) {
    const std::lock_guard<std::mutex> lock(g_mutex);
    start_event_ = recorded_event();
    return;
  }
#endif
  Kokkos::fence();
  start_ = Clock::now();
}

Timed::~Timed() {
  if (label_.empty()) return;
#if defined(KOKKOS_ENABLE_CUDA)
  if (start_event_) {
    t_timing_call = false;
    const std::lock_guard<std::mutex> lock(g_mutex);
    if (g_device_timing) {
      end_span({label_, true, static_cast<cudaEvent_t>(start_event_), nullptr});
    } else {
      g_free_events.push_back(static_cast<cudaEvent_t>(start_event_));
    }
    return;
  }
#endif
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

void start_counting(Timing timing) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_counts = {};
  g_running.clear();
  g_counting = true;
  g_timing = timing != Timing::none;
#if defined(KOKKOS_ENABLE_CUDA)
  g_device_timing = timing == Timing::device;
  g_counts.device_times = g_device_timing;
  g_stream = Kokkos::DefaultExecutionSpace().cuda_stream();
#endif
  set_callbacks(true, g_timing);
}

Dispatches stop_counting() {
  set_callbacks(false, false);
  const std::lock_guard<std::mutex> lock(g_mutex);
#if defined(KOKKOS_ENABLE_CUDA)
  read_spans();
  for (const auto& [id, span] : g_open_spans) g_free_events.push_back(span.start);
  g_open_spans.clear();
  g_device_timing = false;
#endif
  g_counting = false;
  g_timing = false;
  return g_counts;
}

#if defined(KOKKOS_ENABLE_CUDA)
namespace {
void no_global_fencing(std::uint32_t count, Kokkos_Tools_ToolSettings* settings) {
  if (count > 0) settings->requires_global_fencing = false;
}
}  // namespace

bool unfence_kokkos_tools() {
  tools::set_request_tool_settings_callback(no_global_fencing);
  return true;
}
#else
bool unfence_kokkos_tools() { return false; }
#endif

void count_library_call() {
  if (g_counting) ++g_counts.library;
}

void count_graph_launch() {
  if (g_counting) ++g_counts.graphs;
}

bool counting() { return g_counting; }

}  // namespace ddp::kernel_trace
