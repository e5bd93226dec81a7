// The hang watchdog (src/comm/watchdog.hpp) must never fire on a run that is only
// busy: thousands of short collectives, and collectives that each take a good part of
// the timeout, under a timeout of half a second. (That it fires on a real hang, and
// names the rank, is e2e_fault_hang_np3: it ends the job.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>

#include "comm/communicator.hpp"
#include "comm/watchdog.hpp"

namespace {

using namespace std::chrono_literals;

TEST(Watchdog, ManyShortCollectivesNeverFire) {
  ddp::Watchdog watchdog(MPI_COMM_WORLD, 0.5, true);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  double sum = 0;
  const auto until = std::chrono::steady_clock::now() + 3s;
  std::int64_t step = 0;
  int keep_going = 1;
  while (keep_going) {
    ddp::watchdog::set_step(++step);
    ddp::watchdog::set_phase(ddp::Phase::compute);
    double v[2] = {1.0, double(std::chrono::steady_clock::now() < until)};
    comm->allreduce_sum_host(v, 2);
    sum += v[0];
    keep_going = v[1] == double(comm->size());  // every rank stops at the same step
  }
  EXPECT_EQ(sum, double(step) * comm->size());
}

// Each rank in turn arrives 0.3 s late to a collective the others wait in: slow for
// them, not a hang (timeout 0.5 s).
TEST(Watchdog, LateButArrivingRanksDoNotFire) {
  ddp::Watchdog watchdog(MPI_COMM_WORLD, 0.5, true);
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  for (int late = 0; late < comm->size(); ++late) {
    for (int i = 0; i < 3; ++i) {
      if (comm->rank() == late) std::this_thread::sleep_for(300ms);
      comm->barrier();
    }
  }
  SUCCEED();
}

}  // namespace
