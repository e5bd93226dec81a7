#pragma once
// For tests only: makes one rank fail in a chosen way at a chosen step, so the e2e
// tests can check that every kind of failure ends the whole job in one line
// (tests/e2e.cmake, e2e_fault_*). Set by the environment, read once:
//
//   DDP_INJECT_FAULT=<kind>@rank<r>[:step<s>]        (s defaults to 0)
//
//   exception         std::runtime_error thrown in training step s
//   dnnl              oneDNN asked for a primitive it cannot create (dnnl::error), step s
//   bad_alloc         a host allocation that fails (std::bad_alloc), step s
//   view_alloc        a Kokkos View that cannot be allocated, step s
//   loader_exception  std::out_of_range thrown on the prefetch thread, reading batch s
//                     (streamed data with prefetch)
//   perturb           not a failure: after optimizer step s, one parameter of rank r
//                     moves by one ulp (the consistency check must name that rank)
//   nan_gradient      not a failure: in step s the loss gradient of rank r's first
//                     sample is NaN (a finite loss, non-finite gradients: the guard's
//                     and clip_grad_norm's non-finite norm path)
//   stall_shards      at start-up rank r (0: the one that reads) stops for ever while
//                     it reads the shards' layout, as on a file system that stopped
//                     answering; the other ranks wait for it (s: 0)
//   stall_checkpoint  the same while it reads the checkpoint to start from
//   stall_open        at start-up rank r's collective opening of the data files
//                     (HDF5 through MPI-IO) does not return, as a file system call
//                     that stopped answering; the other ranks wait inside it (s: 0)
//   stall_close       the same in the collective closing of the data files at the
//                     end of the run (s: 0)
//   slow_shards       not a failure: rank r reads the shards' layout at start-up in
//                     5 pieces of 1 s each, saying it moves on after each
//                     (watchdog::progress), as on a slow file system (s: 0)
//   kill_shared_memory  rank r, the first of its node, is killed (SIGKILL) once it has
//                     reserved the memory of its node's shared copy of a preload, as by
//                     the kernel's out-of-memory killer; it first prints
//                     `rank <r> (pid <pid>): DDP_INJECT_FAULT: killed` to stderr (s: 0)
//   no_locks          not a failure: rank r (0: the one that locks the run directory)
//                     finds that the run directory's file system keeps no file locks,
//                     as fcntl says on one mounted without them (ENOLCK) (s: 0)
//   stall_end         at the end of the run rank r stops for ever before it ends its
//                     NCCL communicator (ncclCommDestroy), as a rank stuck in its
//                     teardown; the others end theirs (GPU build, comm.backend =
//                     'nccl'; s: 0)
//
// It lives beside the fatal path in src/comm so that both src/io (the loader) and
// src/train (the step) can call it. Unset, a call costs one load and a branch.

#include <mpi.h>

#include <cstdint>

namespace ddp {

enum class FaultSite {
  train_step,        // before the forward pass of each micro-batch; `step` = optimizer steps taken
  prefetch,          // on the prefetch thread before reading a batch; `step` = the batch's number
  parameters,        // after an optimizer step; `step` = optimizer steps taken
  loss_gradient,     // after the loss gradient of each micro-batch; `step` = optimizer steps taken
  shard_layout,      // rank 0 reads the data files' layout at start-up; `step` = 0
  start_checkpoint,  // rank 0 reads the checkpoint to start from; `step` = 0
  shard_open,        // every rank opens the data files (collective) at start-up; `step` = 0
  shard_close,       // every rank closes the data files (collective) at the end; `step` = 0
  run_dir_lock,      // rank 0 locks the run directory at start-up; `step` = 0
  node_shared,       // a node's first rank has reserved its shared memory (NodeShared); `step` = 0
  communicator_end,  // every rank, before it ends its NCCL communicator; `step` = 0
};

// Fails here, as DDP_INJECT_FAULT says, when its kind belongs to `site` and its
// rank and step match; returns false otherwise (and for a malformed value, which
// check_test_variables ends the run on). True: a fault the caller carries out itself
// is due here (perturb, nan_gradient, no_locks).
bool inject_fault(FaultSite site, std::int64_t step);

// Reads DDP_INJECT_FAULT, DDP_TEST_EXIT_DELAY_MS, DDP_TEST_STEP_DELAY_US and
// DDP_TEST_ABORT_HOOK (below);
// a malformed value ends the run as an input error, one line from rank 0 (every rank
// has the same environment). Collective, while MPI runs; Context calls it.
void check_test_variables(MPI_Comm world);

// A slow exit, for the tests of exit 75 under a launcher (tests/checkpoint/exit75.py):
//
//   DDP_TEST_EXIT_DELAY_MS=<ms>@rank<r>
//
// makes rank r sleep <ms> after MPI_Finalize, before the process exits (and before
// MPI_Abort where it ends the job with an error line: inject_abort_delay below). It
// stands for what a rank does after the last synchronisation (library destructors at exit, a
// GPU context's teardown, the MPI runtime's own cleanup), the part of a shutdown no
// barrier covers and in which a launcher that reacts to another rank's exit reaches
// it. The sleeping rank first prints `rank <r> (pid <pid>): DDP_TEST_EXIT_DELAY_MS:
// <ms> ms after MPI_Finalize` to stderr. inject_exit_delay() sleeps; Context calls
// it.
void inject_exit_delay();
// The same delay before MPI_Abort on rank r's fatal path, after its error line and
// with no line of its own: a job slow to end, in which the other ranks' watchdogs
// must not report it again. fail() (comm/check.cpp) calls it.
void inject_abort_delay();

// An abort hook (comm/check.hpp) that never returns, as an ncclCommAbort whose peer
// is gone, on rank r, for the test that a fatal error still ends the job:
//
//   DDP_TEST_ABORT_HOOK=block@rank<r>
//
// check_test_variables registers it; when it runs it prints `DDP_TEST_ABORT_HOOK on
// rank <r>: the abort hook blocks` to stderr.

// A paced run, for tests that must act on a job while it trains (the Slurm requeue
// test signals it once it has trained some epochs):
//
//   DDP_TEST_STEP_DELAY_US=<us>
//
// makes every rank sleep <us> microseconds before each training micro-batch. The
// run takes at least that long per step whatever the CPU, and its ranks leave the
// cores to the launcher, slurmctld and the test between steps; the numbers it
// computes are unchanged.
void inject_step_delay();

}  // namespace ddp
