#include "cuda/device_communicator.hpp"

#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

namespace {

class DeviceMpiCommunicator final : public Communicator {
 public:
  DeviceMpiCommunicator(MPI_Comm comm, cudaStream_t compute, bool stage)
      : mpi_(make_mpi_communicator(comm)), compute_(compute), stage_(stage) {}
  ~DeviceMpiCommunicator() override {
    if (host_) cudaFreeHost(host_);
  }

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  void allreduce_sum(float* data, std::size_t n) override {
    run(data, n, [&](auto* p) { mpi_->allreduce_sum(p, n); });
  }
  void allreduce_sum(double* data, std::size_t n) override {
    run(data, n, [&](auto* p) { mpi_->allreduce_sum(p, n); });
  }
  void broadcast(float* data, std::size_t n, int root) override {
    run(data, n, [&](auto* p) { mpi_->broadcast(p, n, root); });
  }
  void allgather_shares(float* data, const std::vector<std::int64_t>& bounds) override {
    run(data, std::size_t(bounds.back()), [&](auto* p) { mpi_->allgather_shares(p, bounds); });
  }
  // Stage 2 sums the whole buffer as stage 0 does (one MPI_Allreduce), so the stages
  // are bitwise equal on any number of ranks: MPI_Reduce_scatter adds in another
  // order from 3 ranks on. Staged, the whole buffer crosses to the host either way;
  // CUDA-aware, the host's in-place move of the scattered sums (place_scattered)
  // cannot touch device memory, and Open MPI 4's coll/cuda stages no
  // MPI_Reduce_scatter. The rest of `data` holds the other shares' sums, allowed.
  void reduce_scatter_shares(float* data, const std::vector<std::int64_t>& bounds) override {
    allreduce_sum(data, std::size_t(bounds.back()));
  }
  void allreduce_sum_host(double* data, std::size_t n) override { mpi_->allreduce_sum_host(data, n); }
  void allreduce_sum_host_waiting(double* data, std::size_t n) override {
    mpi_->allreduce_sum_host_waiting(data, n);
  }
  void barrier() override {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    mpi_->barrier();
  }
  // MPI's non-blocking collectives know no streams: the gradients are all-reduced
  // after backward, in one call.
  std::unique_ptr<BucketReducer> make_bucket_reducer(float*, std::vector<Bucket>, const std::string&, bool,
                                                     const std::vector<std::int64_t>&) override {
    return nullptr;
  }
  MPI_Comm mpi_comm() const override { return mpi_->mpi_comm(); }

 private:
  template <class T, class Op>
  void run(T* device, std::size_t n, Op&& op) {
    const std::size_t bytes = n * sizeof(T);
    if (!stage_) {
      CUDA_CHECK(cudaStreamSynchronize(compute_));  // the data MPI reads are final
      op(device);
      return;
    }
    if (bytes > host_bytes_) {                      // grown only, reused after
      CUDA_CHECK(cudaStreamSynchronize(compute_));  // the last copy out of it is done
      if (host_) CUDA_CHECK(cudaFreeHost(host_));
      CUDA_CHECK(cudaMallocHost(&host_, bytes));
      host_bytes_ = bytes;
    }
    T* host = static_cast<T*>(host_);
    CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, compute_));
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    op(host);
    // Queued on the compute stream, so the kernels after it see the result; the next
    // call's copy into `host` is queued behind this one.
    CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, compute_));
  }

  std::unique_ptr<Communicator> mpi_;
  cudaStream_t compute_;
  bool stage_;
  void* host_ = nullptr;  // pinned
  std::size_t host_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_device_mpi_communicator(MPI_Comm comm, cudaStream_t compute, bool stage) {
  return std::make_unique<DeviceMpiCommunicator>(comm, compute, stage);
}

std::unique_ptr<Communicator> make_device_communicator(const CommChoice& choice, MPI_Comm comm,
                                                       cudaStream_t compute,
                                                       NcclCommunicator::Options nccl_options) {
  if (choice.backend == Backend::Nccl) return std::make_unique<NcclCommunicator>(comm, compute, nccl_options);
  return make_device_mpi_communicator(comm, compute, choice.stage_through_host);
}

}  // namespace ddp::cuda
