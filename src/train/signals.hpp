#pragma once
// Preemption: Slurm (`--signal=USR1@120`, or SIGTERM before a kill) asks the job
// to stop. The handler only sets a flag (async-signal-safe); the trainer polls it
// at every optimizer-step boundary, the ranks agree on it in a reduction, rank 0
// writes a checkpoint and every rank exits with kExitRequeue.

#include <csignal>

namespace ddp {

// EX_TEMPFAIL of <sysexits.h>: "try again later". The job templates turn it into
// `scontrol requeue`.
constexpr int kExitRequeue = 75;

// SIGUSR1 and SIGTERM set the flag instead of killing the process. Call early,
// before anything long-running; idempotent.
void install_preemption_handlers();

// The signal number received (SIGUSR1 or SIGTERM), 0 if none. This rank only.
int preemption_signal();

// Clears the flag (tests).
void clear_preemption();

}  // namespace ddp
