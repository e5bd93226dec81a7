// Long waits give the core back (src/comm/mpi_wait.hpp): a rank that waits a second
// for a late peer, in the communicator's waiting all-reduce, its barrier, a broadcast
// from a late rank 0 and the shared-memory all-reduce, spends a small part of that second on its core, and
// the results are those of the calls that spin. Before, each such wait kept the core busy for the whole
// second.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <ctime>
#include <functional>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/shm_reducer.hpp"

namespace {

constexpr double kLateS = 1.0;     // the last rank's delay
constexpr double kMostCpuS = 0.2;  // the CPU a waiting rank may spend over it

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int size_of() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Rank `late` (the last one by default) sleeps kLateS before `call`; every other rank
// checks the CPU time its thread spent in `call`, which waits for the late rank.
void expect_waits_idle(const std::function<void()>& call, const char* what, int late = -1) {
  const int rank = rank_of(), size = size_of();
  if (late < 0) late = size - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == late) std::this_thread::sleep_for(std::chrono::duration<double>(kLateS));
  const double cpu0 = thread_cpu_s();
  const auto wall0 = std::chrono::steady_clock::now();
  call();
  const double cpu = thread_cpu_s() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (rank == late || size == 1) return;
  EXPECT_GT(wall, 0.5 * kLateS) << what << ": rank " << rank << " did not wait for the late rank";
  EXPECT_LT(cpu, kMostCpuS) << what << ": rank " << rank << " spent " << cpu << " s of CPU in a wait of "
                            << wall << " s";
}

TEST(MpiWait, TheWaitingAllReduceGivesTheCoreBackAndTheSum) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const int size = size_of();
  std::vector<double> v = {1.0, double(rank_of()), 0.25};
  expect_waits_idle([&] { comm->allreduce_sum_host_waiting(v.data(), v.size()); },
                    "allreduce_sum_host_waiting");
  EXPECT_EQ(v[0], double(size));
  EXPECT_EQ(v[1], double(size * (size - 1) / 2));
  EXPECT_EQ(v[2], 0.25 * size);
}

TEST(MpiWait, TheBarrierGivesTheCoreBack) {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  expect_waits_idle([&] { comm->barrier(); }, "barrier");
}

// Rank 0 broadcasts late, as after reading the shards' layout or a checkpoint.
TEST(MpiWait, BroadcastAndAllReduceAsRankZeroSends) {
  int n = rank_of() == 0 ? 42 : 0;
  expect_waits_idle([&] { ASSERT_EQ(ddp::bcast_waiting(&n, 1, MPI_INT, 0, MPI_COMM_WORLD), MPI_SUCCESS); },
                    "bcast_waiting", 0);
  EXPECT_EQ(n, 42);
  int mine = rank_of(), lowest = -1;
  ASSERT_EQ(ddp::allreduce_waiting(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_EQ(lowest, 0);
}

// The shared-memory all-reduce's barriers, a rank late to finish().
TEST(MpiWait, TheSharedMemoryAllReduceGivesTheCoreBackAndTheSum) {
  const int size = size_of();
  std::vector<float> grads(4096);
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(i % 7) + float(rank_of());
  auto reducer =
      ddp::ShmReducer::make(MPI_COMM_WORLD, grads.data(), ddp::plan_buckets({{0, 4096}}, 0.004, 0.001));
  ASSERT_NE(reducer, nullptr);  // every rank of the test runs on this one machine
  float* g = reducer->take_gradients();
  reducer->mark_ready(0);
  expect_waits_idle([&] { reducer->finish(); }, "ShmReducer::finish");
  for (std::size_t i = 0; i < grads.size(); ++i)
    ASSERT_EQ(g[i], float(i % 7) * float(size) + float(size * (size - 1) / 2)) << "element " << i;
}

// A wait that ends within its first spins returns as soon as its condition holds.
TEST(MpiWait, PollUntilReturnsWhenDone) {
  int calls = 0;
  ddp::poll_until([&] { return ++calls == 5; });
  EXPECT_EQ(calls, 5);
}

}  // namespace
