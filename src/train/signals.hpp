#pragma once
// Preemption: Slurm (`--signal=USR1@120`, or SIGTERM before a kill) asks the job
// to stop. The trainer polls for the signal at every optimizer-step boundary, the
// ranks agree on it in a reduction, rank 0 writes a checkpoint and every rank exits
// with kExitRequeue.
//
// The signals are blocked in every thread and taken synchronously by that poll
// (sigtimedwait), never by a handler interrupting the thread: a handler's signal
// frame is written below the interrupted thread's stack pointer, and oneDNN's JIT
// sgemm on AVX2 CPUs (jit_avx_gemm_f32 in libdnnl 2.6; K > 252, e.g. the MLP's
// first layer with K = 784) runs with rsp pointing into a heap workspace, so a
// SIGUSR1 landing in such a GEMM wrote the frame over malloc's chunk headers and a
// later free() aborted ("free(): invalid pointer", exit 134 instead of 75).

#include <csignal>

namespace ddp {

// EX_TEMPFAIL of <sysexits.h>: "try again later". The job templates turn it into
// `scontrol requeue`.
constexpr int kExitRequeue = 75;

// Blocks SIGUSR1 and SIGTERM in the calling thread, so that every thread started
// after it (MPI's, the prefetch and communication threads, OpenMP's) inherits the
// mask, and installs a flag-setting handler for a thread that unblocks them. Call
// first in main(), before MPI_Init; idempotent.
void install_preemption_handlers();

// The signal number received (SIGUSR1 or SIGTERM), 0 if none. This rank only.
// Takes a pending signal, if any; call it from the thread that trains.
int preemption_signal();

// Clears the flag and discards pending preemption signals (tests).
void clear_preemption();

}  // namespace ddp
