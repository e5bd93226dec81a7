#!/usr/bin/env python3
"""One run at a time in a run directory (src/io/run_dir_lock.hpp), with real jobs.

1. in use: run A (NP ranks, slowed down) trains in RUN_PREFIX_in_use; run B, started
   in the same directory while A runs, ends within seconds in one line (expect_error.sh)
   naming A's rank 0 by pid, host and input, and `ddp_train --check` there passes
   with a warning naming A. A goes on to its end, exit 0, its metrics.jsonl one line
   an epoch and its checkpoints its own.
2. killed: run A2's rank 0 is killed with SIGKILL mid-run (as a crash, or an OOM
   kill); once A2's job has ended, run C starts in the same directory and trains to
   its end: no stale lock.
3. no locks: with DDP_INJECT_FAULT=no_locks@rank0 (fcntl says ENOLCK, as on a file
   system mounted without locks) a run trains to its end and says once, as a warning,
   that nothing stops a second run.

usage: run_dir_in_use.py EXPECT_ERROR_SH MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [--np 2]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from pathlib import Path

from hang import rank_of  # a process's rank, from its environment


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def command(args, run_dir, *more):
    return [args.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(args.np), args.binary, args.nml,
            "train.log_every=0", f"io.run_dir={run_dir}", *more]


def start_slow(args, run_dir, epochs):
    """A run of `epochs` epochs at 0.25 s a step, once its rank 0 holds the lock: the
    process and the lock file's line."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = command(args, run_dir, f"train.epochs={epochs}")
    print("$ DDP_TEST_STEP_DELAY_US=250000 " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, DDP_TEST_STEP_DELAY_US="250000"))
    lock = Path(run_dir) / "ddp_train.lock"
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        line = lock.read_text().split("\n")[0] if lock.exists() else ""
        if line:
            return p, line
        time.sleep(0.05)
    p.kill()
    fail(f"{run_dir}: no line in {lock} within 60 s (exit {p.poll()}): {p.communicate()[0][-2000:]}")


def holder_pid(line, run_dir):
    """The lock file's pid, checked to be a rank 0 of ddp_train now running."""
    m = re.match(r"pid (\d+) on [^,]+, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, input (.+)$", line)
    if not m:
        fail(f"{run_dir}/ddp_train.lock: {line!r} is not 'pid P on HOST, since TIME UTC, input FILE'")
    pid = int(m.group(1))
    comm = Path(f"/proc/{pid}/comm").read_text().strip() if Path(f"/proc/{pid}/comm").exists() else "gone"
    if comm != "ddp_train" or rank_of(pid) != 0:
        fail(f"{run_dir}/ddp_train.lock names pid {pid}, which is {comm} of rank {rank_of(pid)}, not ddp_train's rank 0")
    return pid


def finish(p, what, timeout=120):
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"{what} did not end within {timeout} s")
    return p.returncode, out


def epochs_of(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line).get("epoch") for line in f if '"val_loss"' in line]


def in_use(args):
    run_dir = f"{args.run_prefix}_in_use"
    a, line = start_slow(args, run_dir, 4)
    pid = holder_pid(line, run_dir)
    regex = (rf"^error: rank 0: io\.run_dir '{re.escape(run_dir)}' is in use by another run of ddp_train "
             rf"\(pid {pid} on [^,]+, since [0-9-]+ [0-9:]+ UTC, input {re.escape(args.nml)}; it holds the lock "
             rf"on {re.escape(run_dir)}/ddp_train\.lock\): two runs in one directory would write over each "
             rf"other's checkpoints and metrics; give this run an io\.run_dir of its own, or start it when that "
             rf"run has ended$")
    b = subprocess.run([args.expect_error, regex, "--"] + command(args, run_dir, "train.epochs=4"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(b.stdout, flush=True)
    if b.returncode != 0:
        a.kill()
        fail("run B, in A's directory, did not end as it should (above)")
    # ddp_train --check reads the directory, takes no lock, and says who holds it.
    check = subprocess.run(command(args, run_dir, "train.epochs=4", "--check"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    said = (f"rank 0: warning: io.run_dir '{run_dir}' is in use by another run of ddp_train now ({line}): this run "
            f"would stop at start-up until that one has ended")
    if check.returncode != 0 or said not in check.stderr.splitlines():
        a.kill()
        fail(f"--check in A's directory: exit {check.returncode}, expected 0 and the line {said!r}:\n"
             f"{check.stdout[-2000:]}{check.stderr[-2000:]}")
    if a.poll() is not None:
        fail(f"run A ended (exit {a.returncode}) before run B was refused: the lock was not shown to be held")
    rc, out = finish(a, "run A")
    if rc != 0:
        fail(f"run A, which B left alone, exit {rc}:\n{out[-3000:]}")
    epochs = epochs_of(run_dir)
    if epochs != [1, 2, 3, 4]:
        fail(f"run A's metrics.jsonl has the epochs {epochs}, expected [1, 2, 3, 4]")
    latest = (Path(run_dir) / "checkpoints" / "latest").read_text().strip()
    if latest != "ckpt_000000020.h5":
        fail(f"{run_dir}/checkpoints/latest names {latest}, expected A's last, ckpt_000000020.h5")
    print(f"in use: run B refused in {run_dir} while A (rank 0 pid {pid}) ran; A ended 0 with epochs {epochs}",
          flush=True)


def killed(args):
    run_dir = f"{args.run_prefix}_killed"
    a, line = start_slow(args, run_dir, 20)
    pid = holder_pid(line, run_dir)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    rc, _ = finish(a, "run A2 after its rank 0 was killed", timeout=60)
    if rc == 0:
        fail("run A2 exited 0 although its rank 0 was killed")
    if Path(f"/proc/{pid}").exists():
        fail(f"A2's rank 0, pid {pid}, is still there after its job ended")
    cmd = command(args, run_dir, "train.epochs=1", "io.resume=never")
    print("$ " + " ".join(cmd), flush=True)
    c = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if c.returncode != 0:
        fail(f"run C, after A2's rank 0 was killed, exit {c.returncode}:\n{c.stdout[-3000:]}")
    print(f"killed: A2's rank 0 (pid {pid}) killed, A2's job exit {rc}; run C then trained in {run_dir}, exit 0",
          flush=True)


def no_locks(args):
    run_dir = f"{args.run_prefix}_no_locks"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = command(args, run_dir, "train.epochs=1")
    print("$ DDP_INJECT_FAULT=no_locks@rank0 " + " ".join(cmd), flush=True)
    # Standard error apart: mpiexec forwards a rank's two streams in chunks of its own,
    # so a line of one can land inside a line of the other.
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                       env=dict(os.environ, DDP_INJECT_FAULT="no_locks@rank0"))
    if r.returncode != 0:
        fail(f"the run without locks exit {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    want = (f"rank 0: warning: io.run_dir: the file system of '{run_dir}' keeps no file locks (fcntl on "
            f"{run_dir}/ddp_train.lock: No locks available): nothing stops a second run from starting in this "
            f"directory while this one runs")
    n = sum(1 for line in r.stderr.splitlines() if line == want)
    if n != 1:
        fail(f"{n} lines {want!r} in standard error, expected 1:\n{r.stderr[-3000:]}")
    print("no locks: trained to its end, warned once", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("expect_error")
    ap.add_argument("mpiexec")
    ap.add_argument("binary")
    ap.add_argument("nml")
    ap.add_argument("run_prefix")
    ap.add_argument("--np", type=int, default=2)
    args = ap.parse_args()
    in_use(args)
    killed(args)
    no_locks(args)
    print("PASS")


if __name__ == "__main__":
    main()
