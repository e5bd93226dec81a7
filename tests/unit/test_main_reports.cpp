// The test main's report of a failure on a rank other than 0 (tests/test_main.cpp):
// this test fails on purpose on the last rank only, and CTest passes it when that
// rank's line names the failure and rank 0 says the run failed elsewhere (without
// the report, only the exit status told, and rank 0 printed PASSED).
#include <gtest/gtest.h>
#include <mpi.h>

namespace {

TEST(TestMain, AFailureOnAnotherRankIsPrinted) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_NE(rank, size - 1) << "the planted failure of rank " << rank;
}

}  // namespace
