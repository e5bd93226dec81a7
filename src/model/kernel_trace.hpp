#pragma once
// The heavy kernels of a step (GEMMs, convolutions), recorded so that a benchmark
// can time them alone at the very shapes the model used: the floor a step's time
// is measured against. Recording is off unless a benchmark turns it on; then each
// GEMM and convolution registers a replay of itself. A replay reuses the buffers
// of the recorded call, so it is only for a model that is no longer training.
//
// Also a count of what a step dispatches, for a benchmark that asks: every Kokkos
// kernel (parallel_for, parallel_reduce, parallel_scan, through Kokkos's tool
// callbacks), every deep copy, and every GEMM or convolution call of the backend.
// On a GPU each is at least one launch. Kokkos fences around each kernel while
// a count runs (its tool interface asks that of a tool by default), so a counted
// run's times are not the uncounted run's. A timed count also takes each Kokkos
// kernel's time between those fences: the kernel alone, the work queued before it
// (GEMM and convolution calls, the GPU build's own kernels) already done, plus
// the launch and the fence's return. The GPU build can instead time on the device
// with Kokkos's fences off (Timing::device): CUDA events around each kernel and
// call, the step otherwise run as uncounted.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ddp::kernel_trace {

struct Kernel {
  std::string name;              // e.g. "gemm 64x256x784", "conv2d fwd"
  double flops = 0.0;            // floating-point operations of one call
  std::function<void()> replay;  // runs the same call again
};

// Recording: each GEMM and convolution call with what replays it. A replay reads the
// buffers the call read (the GPU build's narrow copies in the shared slots among
// them), so record a pass that follows an unrecorded one at the same shapes: the
// slots are then grown already, and none frees a buffer a replay points at.
void start();
bool recording();
void record(Kernel kernel);
std::vector<Kernel> stop();

struct Dispatches {
  std::int64_t kokkos = 0;   // Kokkos kernels
  std::int64_t copies = 0;   // Kokkos deep copies
  std::int64_t library = 0;  // GEMM and convolution calls (oneDNN, cuBLAS, cuDNN)
  std::int64_t cuda = 0;     // the GPU build's own CUDA kernels and copies around them (src/cuda)
  std::int64_t graphs = 0;   // CUDA graph launches (train.cuda_graph), each a whole captured step
  std::map<std::string, std::int64_t> kernels;   // Kokkos kernels by label
  std::map<std::string, double> kernel_seconds;  // a timed count: Kokkos kernels' time by label
  // a timed count on a GPU: library calls and own CUDA kernels (Timed) by label
  std::map<std::string, std::int64_t> calls;
  std::map<std::string, double> call_seconds;
  bool device_times = false;  // the times are the device's (Timing::device in the GPU build)
  std::int64_t total() const { return kokkos + copies + library + cuda + graphs; }
  double kernel_seconds_total() const;
  double call_seconds_total() const;
};
// How a count times what it counts.
enum class Timing {
  none,    // counts only
  fenced,  // each Kokkos kernel between the fences Kokkos puts around it for a tool,
           // each library call and own CUDA kernel between fences of its own (host clock)
  device,  // the GPU build: each between two CUDA events on the compute stream, nothing
           // fenced, so the step runs as it does uncounted (uncaptured) and the times are
           // the device's own; needs unfence_kokkos_tools() before Kokkos starts. Kernels
           // on a host execution space are counted, not timed. The CPU build: as fenced.
};
void start_counting(Timing timing = Timing::none);
Dispatches stop_counting();
// Before Kokkos::initialize: asks Kokkos not to fence around kernels and copies for
// this process's tool callbacks, as a device-timed count needs (a fenced one then
// times nothing right). False where this Kokkos cannot (no CUDA: nothing to unfence).
bool unfence_kokkos_tools();
// Whether a count runs: Kokkos then fences at every kernel (or a device-timed count
// records events around each), which no CUDA graph can capture (train.cuda_graph
// waits with its captures until the count ends).
bool counting();
// The backends call this once per GEMM or convolution call.
void count_library_call();
void count_graph_launch();

// In a timed count, the GPU build's library calls (cuBLAS, cuDNN) and its own CUDA
// kernels are timed too: one of these around each call fences the device before
// and after it, as Kokkos does around its kernels (Timing::fenced), or records an
// event on the compute stream before and after it (Timing::device), and adds the
// time under "what detail" (Dispatches::call_seconds). Inside another, it times
// nothing (the outer one holds its time). Outside a timed count it costs a flag's
// test.
class Timed {
 public:
  explicit Timed(const char* what, const char* detail = "");
  ~Timed();
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  std::string label_;  // empty: not timed (no timed count, or inside another)
  std::chrono::steady_clock::time_point start_;
  void* start_event_ = nullptr;  // Timing::device: the cudaEvent_t recorded before the call
};

// The GPU build's own CUDA kernels: counted (Dispatches::cuda) and, in a timed
// count, timed while the returned object lives.
[[nodiscard]] Timed cuda_launch(const char* what, const char* detail = "");

}  // namespace ddp::kernel_trace
