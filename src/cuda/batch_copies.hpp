#pragma once
// Batches from the host to the device without stalling the compute stream: the
// loader's pageable buffers are packed into pinned host memory and copied on a
// stream of their own into one of a few device slots while the compute stream still
// runs the previous step. Ordering is by events only, never a host wait on the
// compute stream:
//   put(s):     host waits for slot s's previous copy (long done: it fed the step
//               before last), packs into its pinned buffer; the copy stream waits
//               for release(s), then copies;
//   acquire(s): the compute stream waits for slot s's copy;
//   release(s): every kernel that reads slot s is enqueued on the compute stream.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace ddp::cuda {

class BatchCopies {
 public:
  struct Part {
    void* device;       // destination in the slot's device buffers
    const void* host;   // pageable source
    std::size_t bytes;
  };

  // `slot_bytes`: the most bytes one put() moves (all its parts together).
  BatchCopies(cudaStream_t compute, int slots, std::size_t slot_bytes);
  ~BatchCopies();
  BatchCopies(const BatchCopies&) = delete;
  BatchCopies& operator=(const BatchCopies&) = delete;

  void put(int slot, const std::vector<Part>& parts);
  void acquire(int slot);
  void release(int slot);

 private:
  struct Slot {
    char* pinned = nullptr;             // (slot_bytes) cudaMallocHost
    cudaEvent_t copied = nullptr;       // on the copy stream, after the slot's copy
    cudaEvent_t released = nullptr;     // on the compute stream, after the slot's last reader
  };
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::size_t slot_bytes_;
  std::vector<Slot> slots_;
};

}  // namespace ddp::cuda
