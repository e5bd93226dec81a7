// Main of every GoogleTest executable: MPI and Kokkos up, the tests, and a
// failure count all-reduced so every rank exits with the same code.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "comm/log.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include <cstdio>
#include <string>

#include "cuda/device.hpp"
#endif

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
  // Only rank 0 prints the progress; failures on any rank still print their messages.
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return any_failed;
}
