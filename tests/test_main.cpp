// Main of every GoogleTest executable: MPI and Kokkos up, the tests, and a
// failure count all-reduced so every rank exits with the same code.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cerrno>
#include <cstdio>
#include <sstream>
#include <string>

#include "comm/log.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/device.hpp"
#endif

namespace {

// The printer of ranks other than 0: their failed assertions alone, each named with
// the rank (rank 0 prints the progress; its own line for a test that failed only
// elsewhere says OK, and the exit status, the same on every rank, fails it).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The test's name kept here: UnitTest::current_test_info() would take the lock that
  // gtest holds while it reports a result (a deadlock).
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  // The report goes out in one write(), every line named with the rank: mpiexec gives
  // a rank's stdout a terminal, line-buffered, and another rank's line landed between
  // the lines of a report printed with printf.
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    const std::string prefix = "rank " + std::to_string(rank_) + ": ";
    std::string report = prefix + (r.file_name() ? r.file_name() : "?") + ":" +
                         std::to_string(r.line_number()) + ": failure in " + test_ + "\n";
    std::istringstream summary(r.summary());
    for (std::string line; std::getline(summary, line);) report += prefix + line + "\n";
    std::fflush(stdout);
    for (std::size_t done = 0; done < report.size();) {
      ssize_t n = ::write(STDOUT_FILENO, report.data() + done, report.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += std::size_t(n);
    }
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ddp::log::set_rank(rank);
#if defined(KOKKOS_ENABLE_CUDA)
  // The GPU build's tests run on the device: without one they are skipped (CTest's
  // SKIP_RETURN_CODE 77), never passed.
  std::string why;
  int devices = ddp::cuda::device_count(&why), fewest = 0;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (rank == 0) std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    MPI_Finalize();
    return 77;
  }
#endif
  Kokkos::initialize(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints the progress; the other ranks print their failures.
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::printf("FAILED on another rank (its lines above)\n");
  Kokkos::finalize();
  MPI_Finalize();
  return any_failed;
}
