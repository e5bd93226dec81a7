#pragma once
// The hang watchdog: a thread on every rank that knows what its rank is doing (the
// phase, the step, and which collective it waits in since when). When a rank has
// waited in one collective longer than comm.timeout_s, it finds which ranks have not
// arrived, without their help, and ends the job with one line naming them:
//
//   rank 0 (node7): hang: waited 600 s (comm.timeout_s) in the gradient all-reduce
//   of step 1234; not arrived: rank 3 (in compute since step 1234); arrived: ranks 0-2
//
// then MPI_Abort. Without their help: each rank keeps its heartbeat (collectives
// entered, step, phase) in its own memory of an MPI window, written with plain
// stores, no communication on the hot path; a waiting rank's watchdog reads the
// others' with MPI_Rget under a deadline of its own, so a rank that is stopped, spins,
// or whose node is gone is found too ("no answer"). Ranks run the same collectives in
// the same order, so a rank that has entered fewer collectives has not arrived.
//
// A rank that reads or writes what the others wait for (data reading, a checkpoint)
// and says it moves on (watchdog::progress) at least every comm.timeout_s is slow,
// not stuck: the others keep waiting while it does, and name it once it has not moved
// for comm.timeout_s.
//
// The lowest waiting rank reports; another waiting rank reports only if that one has
// not ended the job a few seconds later. Without MPI_THREAD_MULTIPLE, or where MPI
// cannot make the window (Open MPI 4.1 across nodes over TCP), the watchdog still
// ends the job, naming the collective and the step but not the ranks.

#include <mpi.h>

#include <cstdint>

namespace ddp {

// failing: this rank has printed its error line and is ending the job (MPI_Abort).
enum class Phase : std::int64_t { setup, data, compute, collective, checkpoint, validation, done, failing };

class Watchdog {
 public:
  // Collective over `comm` (all ranks); starts the thread. timeout_s <= 0: no watchdog.
  Watchdog(MPI_Comm comm, double timeout_s, bool thread_multiple);
  ~Watchdog();  // collective: stops the thread, frees the window
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
};

namespace watchdog {
// What this rank does now; cheap (relaxed stores), callable whether or not a
// Watchdog runs.
void set_step(std::int64_t step);
void set_phase(Phase phase);
// This rank's reading or writing moved on (a piece of a file done): while it is in
// data reading or a checkpoint, the ranks waiting for it wait on as long as it calls
// this at least every comm.timeout_s. Entering a phase counts as a call.
void progress();

// A Watchdog's thread watches this rank (comm.timeout_s > 0, between its construction
// and stop()): a wait that polls on its own (NCCL's) leaves the deadline to it, which
// names the ranks and tells a slow rank from a stuck one.
bool running();

// Stops this rank's watchdog thread and takes its heartbeat out of the window, before
// an MPI_Finalize that the Watchdog's destructor does not precede: the fatal path's
// exit of all ranks together (comm/check.cpp). The thread's tick, written into window
// memory that MPI_Finalize had freed, crashed ranks there (signal 11, 1 run in 15 on a
// loaded 2-core machine). Local, not collective; a no-op without a Watchdog.
void stop();

// This rank does `phase` from construction to destruction (rank 0 reading what the
// others wait for); the phase before it is restored.
class During {
 public:
  explicit During(Phase phase);
  ~During();
  During(const During&) = delete;
  During& operator=(const During&) = delete;

 private:
  Phase before_;
};

// What a collective waits on besides the other ranks: the network alone, or also
// the file system (a collective open or close of MPI-IO, inside HDF5), whose call on
// one rank may not return while the others wait for it inside the same collective.
enum class Through { network, file_system };

// This rank waits in the collective `what` (a string literal: "the gradient
// all-reduce") from construction to destruction; the phase before it is restored.
class Collective {
 public:
  explicit Collective(const char* what, Through through = Through::network);
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

 private:
  Phase before_;
};
}  // namespace watchdog

}  // namespace ddp
