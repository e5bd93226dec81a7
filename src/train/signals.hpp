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
//
// After the stop's checkpoint is on disk a SIGTERM is no longer a stop request but a
// launcher giving up, and it is honoured at once (exit_on_sigterm): mpirun answers
// the first rank's exit 75 (any non-zero exit, orte_abort_on_non_zero_status) by
// sending the other ranks SIGCONT, SIGTERM 1 s later and SIGKILL to their process
// group 1 s after that (odls_base_sigkill_timeout); srun --kill-on-bad-exit, SIGTERM
// and SIGKILL KillWait later. Every rank has passed the last barrier (comm/context.hpp)
// when the first one exits, so such a SIGTERM finds the others in MPI_Finalize or in
// their exit, and ending them with 75 is the truth: their part of the stop is done.

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

// Call on the thread that will exit (main), once the checkpoint of an agreed stop is
// on disk and every rank knows it (a collective after rank 0's write). From then on a
// SIGTERM ends the process at once with `status`, from a handler calling _exit: what
// is left is teardown, and a launcher's SIGTERM must not wait for its SIGKILL (a
// swallowed one did: exit 137). This rank's own stop request, still pending when
// another rank's signal decided the stop, is taken first, so it is not mistaken for a
// second one. A SIGTERM that arrives while rank 0 writes the checkpoint waits until
// here: the write (temp file, fsync, rename) is the point of the stop, and the job's
// SIGKILL still bounds it. SIGUSR1 stays blocked: a resent stop request is not a kill.
void exit_on_sigterm(int status);

// Clears the flag and discards pending preemption signals (tests).
void clear_preemption();

}  // namespace ddp
