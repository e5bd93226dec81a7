#pragma once
// The memory plan's tests: the Kokkos allocations that live, by address (bytes and
// label), recorded while a RecordAllocations lives, with the host's buffers unskewed
// meanwhile (set_buffer_skew(false): plain Views of their size, as a GPU's).

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "model/tensor.hpp"

namespace ddp::test {

using LiveBlocks = std::map<const void*, std::pair<std::uint64_t, std::string>>;

inline LiveBlocks& live_blocks() {
  static LiveBlocks blocks;
  return blocks;
}

class RecordAllocations {
 public:
  RecordAllocations() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(
        [](const Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr, std::uint64_t bytes) {
          live_blocks()[ptr] = {bytes, label};
        });
    Kokkos::Tools::Experimental::set_deallocate_data_callback(
        [](const Kokkos::Profiling::SpaceHandle, const char*, const void* ptr, std::uint64_t) {
          live_blocks().erase(ptr);
        });
    set_buffer_skew(false);
  }
  ~RecordAllocations() {
    set_buffer_skew(true);
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
  RecordAllocations(const RecordAllocations&) = delete;
  RecordAllocations& operator=(const RecordAllocations&) = delete;
};

// The floats allocated since `before` and still held, in *blocks blocks, but for the
// small sums the plans leave out (the partial column and channel sums), Kokkos's own
// (its teams' scratch), and the host's fp32 copies of narrow GEMM operands and
// results (gemm_stored::, where narrow transformer activations, the GPU's plan, run
// on the host: cuBLAS reads and writes them as they are).
inline std::int64_t allocated_since(const LiveBlocks& before, std::int64_t* blocks) {
  std::int64_t floats = 0;
  for (const auto& [ptr, block] : live_blocks())
    if (!before.count(ptr) && block.second.find("::partial") == std::string::npos &&
        block.second.rfind("Kokkos::", 0) != 0 && block.second.rfind("gemm_stored::", 0) != 0) {
      floats += std::int64_t(block.first / 4);
      ++*blocks;
    }
  return floats;
}

}  // namespace ddp::test
