#!/usr/bin/env python3
"""Runs one MPI rank's command and records how it ended, as the launcher saw it.

usage: mpirun -n N rank_status.py STATUS_DIR COMMAND [ARG ...]
       srun rank_status.py STATUS_DIR COMMAND [ARG ...]

Writes STATUS_DIR/rank<r>.pid (r from OMPI_COMM_WORLD_RANK, PMIX_RANK or SLURM_PROCID)
holding the command's pid once it runs, and STATUS_DIR/rank<r> holding its exit
status, or 128+N when signal N ended it ("137" for a SIGKILL), once it ends; exits
the same way, so the launcher sees what it would have seen.

A launcher that gives up on a job signals each rank's process group (mpirun: SIGCONT,
SIGTERM 1 s later, SIGKILL to the group 1 s after that). To see the command die of
that SIGKILL, the status is not taken by this process (the one the launcher started,
which stays in its group and so lives and dies with the command) but by a child that
moves to a process group of its own, starts the command in the launcher's group and
waits for it. Under srun's process tracking that child may be killed too: then no
file is written, which a test counts as a killed rank as well.
"""
import os
import signal
import subprocess
import sys


def ignore(*_):
    """A handler that does nothing: the signal does not end this process, and a command
    started from here gets the default disposition back at exec (an ignored one would
    stay ignored)."""


def write(path, number):
    """path holds number and a newline, or does not exist."""
    with open(path + ".tmp", "w") as f:
        f.write(f"{number}\n")
    os.rename(path + ".tmp", path)


def end_like(rc):
    """Exits with status rc, or dies of signal -rc."""
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    os._exit(rc & 255)


def rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return os.environ[var]
    return "0"


def main():
    status_dir, cmd = sys.argv[1], sys.argv[2:]
    if not cmd:
        sys.exit(__doc__)
    # The launcher forwards SIGUSR1 and sends SIGTERM: they are for the command.
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, ignore)
    group = os.getpgrp()
    recorder = os.fork()
    if recorder == 0:
        os.setpgid(0, 0)
        p = subprocess.Popen(cmd, process_group=group)
        path = os.path.join(status_dir, f"rank{rank()}")
        write(path + ".pid", p.pid)
        rc = p.wait()
        write(path, 128 - rc if rc < 0 else rc)
        end_like(rc)
    _, wstatus = os.waitpid(recorder, 0)
    end_like(os.waitstatus_to_exitcode(wstatus))


if __name__ == "__main__":
    main()
