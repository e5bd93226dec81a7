#pragma once
// Waits on MPI requests that give a core back through a long wait.
//
// Open MPI's blocking calls (MPI_Wait, and MPI_Allreduce, MPI_Bcast, MPI_Barrier
// made of them) poll at full speed until they complete: a rank that waits seconds for
// a peer (rank 0 writing a checkpoint or reading the shards' layout, a straggler, a
// stopped rank the watchdog will name) keeps a core busy all that time, one that
// another rank's threads, rank 0's checkpoint writer or, in a test suite, another
// test could use (checkpoint_slow_disk: 54 s of CPU in 67 s on a 2-core EPYC, most
// of it one rank in MPI_Allreduce while the other wrote). wait_for() polls as fast
// for the first 10 ms, which a step's wait stays within, then sleeps between polls
// (poll_until), so a wait past 10 ms ends up to a nap (at most 1 ms) later (a
// collective's each round through a napping rank, as Open MPI's nonblocking ones
// progress only inside MPI_Test: a few ms, off the step's path). The
// shared-memory all-reduce's barriers wait so too. (Sleeping past 1 ms instead,
// 2-rank fashion_resnet runs were 6-19% slower than before in two alternated pairs
// of three: within this VM's noise, but not risked.)
//
// The collectives here start with their nonblocking forms (MPI_Iallreduce,
// MPI_Ibarrier, MPI_Ibcast) and end in wait_for(). Every rank receives the same bits;
// an all-reduce of doubles over 3 or more ranks may add them in another order than
// MPI_Allreduce would. The step's MPI collectives stay blocking: their waits are short
// and the step feels their latency.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace ddp {

// A wait's first stretch, in which the poll goes on without a sleep (kSpins polls back
// to back, then a yield of the core between polls, for ranks that share cores), and
// the sleeps between polls past it: kNap, doubling to kLongestNap. (MPI_Test costs
// tens of microseconds in Open MPI, which makes progress inside it: with a fixed
// 50 us nap a rank spent 0.2 s of CPU a second of waiting.)
constexpr int kSpins = 2000;
constexpr std::chrono::milliseconds kPollFor{10};
constexpr std::chrono::microseconds kNap{50};
constexpr std::chrono::microseconds kLongestNap{1000};

// Calls `done()` until it returns true: kSpins times back to back, then yielding the
// core between calls until kPollFor has passed, then sleeping between calls, kNap
// first and twice as long each time up to kLongestNap.
// (The clock runs from the first call: kSpins MPI_Tests may take tens of ms.)
template <class Done>
void poll_until(Done&& done) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSpins; ++i) {
    if (done()) return;
    if (i % 64 == 63 && std::chrono::steady_clock::now() - start >= kPollFor) break;
  }
  auto nap = kNap;
  while (!done()) {
    if (std::chrono::steady_clock::now() - start < kPollFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(2 * nap, kLongestNap);
    }
  }
}

// MPI_Wait without a busy core past kPollFor; MPI_Test's error code, MPI_SUCCESS when done.
int wait_for(MPI_Request& request);

// MPI_Bcast, MPI_Allreduce and MPI_Barrier as their nonblocking forms ended by
// wait_for(): for the calls a rank may wait long in, while another reads or writes.
int bcast_waiting(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm);
int allreduce_waiting(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int barrier_waiting(MPI_Comm comm);

}  // namespace ddp
