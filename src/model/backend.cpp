#include "model/backend.hpp"

#include <Kokkos_Core.hpp>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "comm/check.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/cuda_backend.hpp"
#else
#include "model/onednn/onednn_backend.hpp"
#endif

namespace ddp {

namespace {
std::unique_ptr<ComputeBackend> g_backend;

// watch_device_memory's record: blocks by address with their numbers, and the numbers
// of those freed since take_device_frees. Allocations may come from any thread.
std::mutex g_memory_mutex;
bool g_watching = false;
std::uint64_t g_allocations = 0;
std::unordered_map<const void*, std::uint64_t> g_blocks;
std::vector<std::uint64_t> g_freed;
std::vector<std::string> g_changes;  // since take_device_frees: what, for an error line
constexpr std::size_t kChangesNamed = 4;

void note_change(std::string what) {
  if (g_changes.size() < kChangesNamed)
    g_changes.push_back(std::move(what));
  else if (g_changes.size() == kChangesNamed)
    g_changes.push_back("...");
}

// Kokkos's tools callbacks for every view's memory: host memory ("Host") is not what
// a graph points into; device and pinned memory are. Empty blocks hold nothing to
// point at: Kokkos's CUDA team kernels without scratch memory allocate 0 bytes of
// "TeamScratchMemory" at every launch (Kokkos 4.6), which would stop every capture
// of a model with batch norm.
void on_allocate(const Kokkos::Profiling::SpaceHandle space, const char* label, const void* ptr,
                 std::uint64_t bytes) {
  if (std::strcmp(space.name, "Host") == 0 || bytes == 0) return;
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  g_blocks[ptr] = ++g_allocations;
  note_change(std::string("'") + label + "' allocated");
}
void on_deallocate(const Kokkos::Profiling::SpaceHandle space, const char* label, const void* ptr,
                   std::uint64_t bytes) {
  if (std::strcmp(space.name, "Host") == 0 || bytes == 0) return;
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  const auto it = g_blocks.find(ptr);
  g_freed.push_back(it == g_blocks.end() ? 0 : it->second);  // unknown: as old as can be
  note_change(std::string("'") + label + "' freed");
  if (it != g_blocks.end()) g_blocks.erase(it);
}
}  // namespace

void watch_device_memory() {
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  if (g_watching) return;
  g_watching = true;
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
}

std::uint64_t device_allocations() {
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  return g_allocations;
}

std::vector<std::uint64_t> take_device_frees() {
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  g_changes.clear();
  return std::exchange(g_freed, {});
}

void device_block_freed(const std::string& what) {
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  if (!g_watching) return;  // unwatched, nobody would take them
  g_freed.push_back(0);
  note_change(what + " freed");
}

std::string device_memory_changes() {
  const std::lock_guard<std::mutex> lock(g_memory_mutex);
  std::string line;
  for (const std::string& c : g_changes) line += (line.empty() ? "" : ", ") + c;
  return line;
}

void NarrowCopies::add(const float* from, std::int64_t n, Precision p, const void* copy,
                       std::size_t element_bytes) {
  for (const Copy& c : copies_)
    DDP_REQUIRE(c.p != p || from + n <= c.from || c.from + c.n <= from,
                "two narrow copies of overlapping floats are kept at once");
  copies_.push_back({from, n, p, static_cast<const char*>(copy), element_bytes});
}

void NarrowCopies::forget(const float* from) {
  for (std::size_t i = 0; i < copies_.size(); ++i)
    if (copies_[i].from == from) {
      copies_.erase(copies_.begin() + std::ptrdiff_t(i));
      return;
    }
  DDP_REQUIRE(false, "a narrow copy forgotten that was not kept");
}

const void* NarrowCopies::find(const float* at, std::int64_t floats, Precision p) const {
  for (const Copy& c : copies_)
    if (c.p == p && at >= c.from && at + floats <= c.from + c.n)
      return c.copy + std::size_t(at - c.from) * c.element_bytes;
  return nullptr;
}

ComputeBackend& compute_backend() {
  if (!g_backend) {
    DDP_REQUIRE(Kokkos::is_initialized(), "the compute backend is made after Kokkos::initialize");
#if defined(KOKKOS_ENABLE_CUDA)
    // Kokkos's default instance runs on a stream of its own: cuBLAS and cuDNN join it.
    g_backend = cuda::make_cuda_backend(Kokkos::DefaultExecutionSpace().cuda_stream());
#else
    g_backend = make_onednn_backend();
#endif
    // Handles and workspaces go before the device does.
    Kokkos::push_finalize_hook([] { g_backend.reset(); });
  }
  return *g_backend;
}

std::unique_ptr<ComputeBackend> swap_compute_backend(std::unique_ptr<ComputeBackend> backend) {
  compute_backend();
  std::swap(g_backend, backend);
  return backend;
}

}  // namespace ddp
