#!/usr/bin/env python3
"""Exit 75 from every rank under mpiexec, when a rank is slow to exit.

mpiexec (Open MPI 4.1) treats the first rank's exit 75 as a failed job: it sends the
other ranks SIGCONT, SIGTERM 1 s later and SIGKILL to their process group 1 s after
that. Every rank runs under rank_status.py, which records how it ended as the launcher
saw it; the test hook DDP_TEST_EXIT_DELAY_MS makes one rank sleep after MPI_Finalize
(a slow exit: library destructors, a GPU context's teardown). The tiny data set, 2
ranks, no periodic checkpoints: the only checkpoint is the stop's.

slow_exit: SIGUSR1 to mpiexec once the run trains; rank 1 takes 8 s to exit. Every
  rank must exit 75 (with the SIGTERM swallowed rank 1 died of the SIGKILL: 137),
  mpiexec too, and the checkpoint must resume: the run continues from it to the end
  of the stopped epoch, exit 0.
second_sigterm: a SIGTERM after the stop's checkpoint is honoured at once, one during
  the checkpoint's write once the checkpoint is complete.
  1. mpiexec --mca orte_abort_on_non_zero_status 0 (it leaves the ranks alone), rank 1
     sleeping 300 s after MPI_Finalize: the test sends it SIGTERM; it must exit 75 and
     the run end long before the 300 s.
  2. DDP_TEST_CHECKPOINT_DELAY_MS holds rank 0 between the fsync of the temp file and
     its rename, and rank 0 would sleep 300 s after MPI_Finalize: SIGTERM to both ranks
     while the temp file exists. The checkpoint must be completed (`latest` names it, no
     temp file) and resume, both ranks exit 75 at once after it, saying so.

usage: exit75.py slow_exit|second_sigterm MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from common import EX_TEMPFAIL, fail, latest, mpirun, run, state

part, mpiexec, binary, nml, run_dir = sys.argv[1:6]
RANK_STATUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_status.py")
NP = 2
LONG = 300_000  # ms: an exit delay the test never waits for


class Run:
    """A fresh 2-rank run that would train for long, each rank under rank_status.py;
    its output goes to <run dir>.out."""

    def __init__(self, name, env, mca=()):
        self.dir = f"{run_dir}_{name}"
        self.status_dir = self.dir + "_status"
        for d in (self.dir, self.status_dir):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(self.status_dir)
        cmd = mpirun(mpiexec, NP, sys.executable,
                     [RANK_STATUS, self.status_dir, binary, nml, "train.epochs=100000", "train.log_every=0",
                      "io.checkpoint_every=0", f"io.run_dir={self.dir}"])
        for m in mca:
            cmd[1:1] = ["--mca"] + m.split("=")
        print("$ " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd), flush=True)
        self.out = open(self.dir + ".out", "w+")
        self.p = subprocess.Popen(cmd, env=dict(os.environ, **env), stdout=self.out, stderr=subprocess.STDOUT)

    def text(self):
        with open(self.out.name) as f:
            return f.read()

    def pid(self, r):
        with open(os.path.join(self.status_dir, f"rank{r}.pid")) as f:
            return int(f.read())

    def kill(self):
        """SIGKILL to the ranks and mpiexec (mpiexec's SIGKILL alone would leave the ranks)."""
        for r in range(NP):
            try:
                os.kill(self.pid(r), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        self.p.kill()
        self.p.wait()

    def wait_for(self, what, predicate, timeout=120):
        deadline = time.time() + timeout
        while not predicate():
            if time.time() > deadline or self.p.poll() is not None:
                ended = self.p.poll() is not None
                self.kill()
                sys.stdout.write(self.text())
                fail(f"{what}: not seen ({'mpiexec ended' if ended else f'{timeout} s'})")
            time.sleep(0.05)

    def stop(self):
        """SIGUSR1 to mpiexec, which forwards it, once rank 0 has trained 2 epochs."""
        self.wait_for("rank 0's 'epoch 3/' line", lambda: re.search(r"^epoch 3/", self.text(), re.M))
        self.p.send_signal(signal.SIGUSR1)
        print(">>> SIGUSR1 to mpiexec", flush=True)

    def finish(self, timeout):
        """mpiexec's exit status and the output; None if it did not end within timeout."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        o = self.text()
        sys.stdout.write(o)
        print(f"mpiexec exit status {rc}", flush=True)
        return rc, o

    def statuses(self):
        """Each rank's exit status (None: no file, the recorder died too). The recorders
        of ranks killed with their process group write last: a few seconds to appear."""
        files = [os.path.join(self.status_dir, f"rank{r}") for r in range(NP)]
        deadline = time.time() + 10
        while not all(os.path.exists(f) for f in files) and time.time() < deadline:
            time.sleep(0.1)
        return [int(open(f).read()) if os.path.exists(f) else None for f in files]

    def require_all_75(self, what):
        st = self.statuses()
        print(f"{what}: exit status per rank {st}", flush=True)
        if st != [EX_TEMPFAIL] * NP:
            fail(f"{what}: exit status per rank {st}, expected {EX_TEMPFAIL} from every rank "
                 "(137: killed by the launcher's SIGKILL; None: no status recorded)")


def require_loadable(rdir):
    """The stop's checkpoint is complete and the run resumes from it, to the end of its epoch."""
    ckdir = os.path.join(rdir, "checkpoints")
    if glob.glob(os.path.join(ckdir, "*.tmp.*")):
        fail(f"temp files left in {ckdir}: {os.listdir(ckdir)}")
    ckpt = os.path.join(ckdir, latest(rdir))
    epoch = state(ckpt)["epoch"]
    rc, out, _ = run(mpirun(mpiexec, NP, binary, [nml, "train.log_every=0", "io.checkpoint_every=0",
                                                  f"train.epochs={epoch + 1}", f"io.run_dir={rdir}"]))
    if rc != 0 or f"resumed from {ckpt} at epoch {epoch + 1}" not in out:
        fail(f"the resumed run: exit status {rc}, or no 'resumed from {ckpt}' line")
    print(f"{ckpt} resumed and the run finished epoch {epoch + 1}", flush=True)


def slow_exit():
    job = Run("slow", {"DDP_TEST_EXIT_DELAY_MS": "8000@rank1"})
    job.stop()
    rc, _ = job.finish(120)
    job.require_all_75("stop with rank 1 slow to exit")
    if rc != EX_TEMPFAIL:
        fail(f"mpiexec exit status {rc}, expected {EX_TEMPFAIL}")
    require_loadable(job.dir)


def second_sigterm():
    # 1. After the checkpoint, from the test rather than the launcher.
    job = Run("after", {"DDP_TEST_EXIT_DELAY_MS": f"{LONG}@rank1"}, mca=["orte_abort_on_non_zero_status=0"])
    job.stop()
    job.wait_for("rank 1's exit delay line", lambda: "rank 1 (pid" in job.text())
    os.kill(job.pid(1), signal.SIGTERM)
    print(f">>> SIGTERM to rank 1 (pid {job.pid(1)}) while it sleeps {LONG} ms after MPI_Finalize", flush=True)
    rc, o = job.finish(60)
    if rc is None:
        fail("SIGTERM during the exit not honoured: mpiexec still running 60 s later")
    job.require_all_75("SIGTERM after the checkpoint")
    if "rank 1: SIGTERM after the stop's checkpoint: exit 75 now" not in o:
        fail("no 'rank 1: SIGTERM after the stop's checkpoint' line")

    # 2. During rank 0's checkpoint write: waits for the checkpoint, then honoured.
    job = Run("during", {"DDP_TEST_CHECKPOINT_DELAY_MS": "3000", "DDP_TEST_EXIT_DELAY_MS": f"{LONG}@rank0"})
    job.stop()
    ckdir = os.path.join(job.dir, "checkpoints")
    job.wait_for("the temp checkpoint file", lambda: glob.glob(os.path.join(ckdir, "ckpt_*.h5.tmp.*")))
    for r in range(NP):
        os.kill(job.pid(r), signal.SIGTERM)
    print(">>> SIGTERM to both ranks while rank 0 writes the checkpoint", flush=True)
    rc, o = job.finish(60)
    if rc is None:
        fail("SIGTERM during the checkpoint write not honoured after it: mpiexec still running 60 s later")
    job.require_all_75("SIGTERM during the checkpoint write")
    for r in range(NP):
        if f"rank {r}: SIGTERM after the stop's checkpoint: exit 75 now" not in o:
            fail(f"no 'rank {r}: SIGTERM after the stop's checkpoint' line: the SIGTERM was lost")
    if "preempted: checkpoint" not in o:
        fail("no 'preempted: checkpoint ...' line")
    require_loadable(job.dir)


{"slow_exit": slow_exit, "second_sigterm": second_sigterm}[part]()
print("PASS")
