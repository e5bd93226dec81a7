#include "cuda/batch_copies.hpp"

#include <cstring>

#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

BatchCopies::BatchCopies(cudaStream_t compute, int slots, std::size_t slot_bytes)
    : compute_(compute), slot_bytes_(slot_bytes), slots_(std::size_t(slots)) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (Slot& s : slots_) {
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.pinned), slot_bytes_));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.released, cudaEventDisableTiming));
  }
}

BatchCopies::~BatchCopies() {
  // Not checked: a destructor may run on the way out of a failing job.
  cudaStreamSynchronize(copy_);
  for (Slot& s : slots_) {
    cudaFreeHost(s.pinned);
    cudaEventDestroy(s.copied);
    cudaEventDestroy(s.released);
  }
  cudaStreamDestroy(copy_);
}

void BatchCopies::put(int slot, const std::vector<Part>& parts) {
  Slot& s = slots_[std::size_t(slot)];
  CUDA_CHECK(cudaEventSynchronize(s.copied));  // the pinned buffer's last copy has left it
  std::size_t at = 0;
  for (const Part& p : parts) {
    if (at + p.bytes > slot_bytes_) DDP_FATAL("BatchCopies::put: " << at + p.bytes << " bytes > slot of " << slot_bytes_);
    std::memcpy(s.pinned + at, p.host, p.bytes);
    at += p.bytes;
  }
  CUDA_CHECK(cudaStreamWaitEvent(copy_, s.released, 0));  // the step that last read the slot is done
  at = 0;
  for (const Part& p : parts) {
    CUDA_CHECK(cudaMemcpyAsync(p.device, s.pinned + at, p.bytes, cudaMemcpyHostToDevice, copy_));
    at += p.bytes;
  }
  CUDA_CHECK(cudaEventRecord(s.copied, copy_));
}

void BatchCopies::acquire(int slot) {
  CUDA_CHECK(cudaStreamWaitEvent(compute_, slots_[std::size_t(slot)].copied, 0));
}

void BatchCopies::release(int slot) { CUDA_CHECK(cudaEventRecord(slots_[std::size_t(slot)].released, compute_)); }

}  // namespace ddp::cuda
