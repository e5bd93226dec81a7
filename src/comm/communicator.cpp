#include "comm/communicator.hpp"

#include <algorithm>
#include <climits>

#include "comm/check.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/shm_reducer.hpp"
#include "comm/watchdog.hpp"

namespace ddp {

namespace {

// MPI counts are int: long buffers go in chunks.
constexpr std::size_t kMaxChunk = std::size_t(INT_MAX) / 2;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) {
    MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* data, std::size_t n) override {
    watchdog::Collective guard("an all-reduce (MPI_Allreduce)");
    allreduce(data, n, MPI_FLOAT);
  }
  void allreduce_sum(double* data, std::size_t n) override {
    watchdog::Collective guard("an all-reduce (MPI_Allreduce)");
    allreduce(data, n, MPI_DOUBLE);
  }

  void allreduce_sum_host(double* data, std::size_t n) override {
    watchdog::Collective guard("an all-reduce of flags or sums (MPI_Allreduce)");
    allreduce(data, n, MPI_DOUBLE);
  }
  void allreduce_sum_host_waiting(double* data, std::size_t n) override {
    watchdog::Collective guard("an all-reduce of flags or sums (MPI_Allreduce)");
    if (size_ == 1) return;
    for (std::size_t off = 0; off < n; off += kMaxChunk)
      MPI_CHECK(allreduce_waiting(MPI_IN_PLACE, data + off, int(std::min(kMaxChunk, n - off)), MPI_DOUBLE,
                                  MPI_SUM, comm_));
  }

  std::unique_ptr<BucketReducer> make_bucket_reducer(float* grads, std::vector<Bucket> buckets,
                                                     const std::string& overlap, bool shared_memory,
                                                     const std::vector<std::int64_t>& scatter_to) override {
    const GradientReducer::Progress progress = GradientReducer::parse_progress(overlap);
    if (shared_memory)
      if (auto shm = ShmReducer::make(comm_, grads, buckets, scatter_to)) return shm;
    return std::make_unique<GradientReducer>(comm_, grads, std::move(buckets), progress, scatter_to);
  }

  void allgather_shares(float* data, const std::vector<std::int64_t>& bounds) override {
    watchdog::Collective guard("an all-gather of the parameter shares (MPI_Allgatherv)");
    if (size_ == 1) return;
    const ShareCounts c = share_counts(bounds, 0, bounds.back());
    MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c.counts.data(), c.displs.data(),
                             MPI_FLOAT, comm_));
  }

  void reduce_scatter_shares(float* data, const std::vector<std::int64_t>& bounds) override {
    watchdog::Collective guard("a reduce-scatter of the gradients (MPI_Reduce_scatter)");
    if (size_ == 1) return;
    reduce_scatter_range(comm_, rank_, data, 0, bounds.back(), bounds, nullptr);
  }

  void broadcast(float* data, std::size_t n, int root) override {
    watchdog::Collective guard("a broadcast (MPI_Bcast)");
    for (std::size_t off = 0; off < n; off += kMaxChunk)
      MPI_CHECK(MPI_Bcast(data + off, int(std::min(kMaxChunk, n - off)), MPI_FLOAT, root, comm_));
  }

  void barrier() override {
    watchdog::Collective guard("a barrier (MPI_Barrier)");
    MPI_CHECK(barrier_waiting(comm_));
  }
  MPI_Comm mpi_comm() const override { return comm_; }

 private:
  template <class T>
  void allreduce(T* data, std::size_t n, MPI_Datatype type) {
    if (size_ == 1) return;
    for (std::size_t off = 0; off < n; off += kMaxChunk)
      MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data + off, int(std::min(kMaxChunk, n - off)), type, MPI_SUM, comm_));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace ddp
