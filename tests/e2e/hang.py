#!/usr/bin/env python3
"""A rank that stops answering (kill -STOP, as a node that hangs or a process stuck
in the kernel) must not leave the job waiting: the hang watchdog of a waiting rank
ends it within comm.timeout_s + 5 s, in one line that names the stopped rank as not
arrived (not running) and the others as waiting.

Scenarios, each a fresh run of NP ranks training a long tiny run: the stopped rank
is the last one, then rank 0 (which would otherwise be the one to report).

usage: hang.py MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [--np 3] [--timeout-s 5] [--no-window] [--gpu-build]
               [--launcher PROGRAM] [--backend mpi|nccl] [--stop-rank R ...] [--kill] [--slack-s 5]

--no-window: Open MPI's osc/pt2pt only, which refuses MPI_THREAD_MULTIPLE, so the
watchdog has no window, as across hosts over TCP: the last rank is stopped, and the
line names the collective and the step, and says which ranks is unknown. Nor is
there a shared-memory window: the run says its gradients are summed by MPI. Without
--no-window they are summed in shared memory (all ranks on this machine), and the
waiting ranks' barriers there are what the watchdog must see through.
--gpu-build: the GPU build keeps gradients in device memory: the run names NCCL or
MPI with device buffers instead of either reducer line.
--launcher PROGRAM: each rank runs PROGRAM DDP_TRAIN ... (tools/nccl_one_gpu, which
execs ddp_train: the rank's pid stays the one signalled).
--backend NAME: comm.backend = NAME; with --gpu-build and 'nccl' the run must say
`comm: NCCL on device buffers`.
--stop-rank R: the ranks to stop, one scenario each, in that order (default: the
last, then 0; with --no-window or --kill the last alone).
--kill: SIGKILL instead of SIGSTOP, a rank that dies: the job must end within
comm.timeout_s + 5 s, with some line naming the dead rank (the launcher's, e.g. Open
MPI's `process rank K with PID ... exited on signal 9`, or a watchdog line whose
`not arrived` names it); how many `hang:` lines come is not held.
In every scenario no rank of the job may be left running 5 s after it ended.
--slack-s S: the 5 s after comm.timeout_s (the NCCL tests: 10, for the abort hooks'
ncclCommAbort, which src/comm/check.cpp allows 5 s, beside the watchdog's own reads).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from pathlib import Path


def children(pid):
    """Processes whose parent is pid."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def rank_of(pid):
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(kv.split(b"=", 1)[1])
    return None


def running(pid):
    """Whether pid is a live process (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def metrics_lines(run_dir):
    try:
        return sum(1 for _ in open(os.path.join(run_dir, "metrics.jsonl")))
    except OSError:
        return 0


def scenario(args, stop_rank, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    no_window = ["--mca", "osc", "pt2pt"] if args.no_window else []
    launcher = [args.launcher] if args.launcher else []
    # Through the launcher (ranks time-sliced on one GPU), the ranks unbound, as
    # nccl_runs.py's.
    launcher = (["--bind-to", "none"] + launcher) if launcher else []
    backend = [f"comm.backend={args.backend}"] if args.backend else []
    cmd = [args.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(args.np)] + no_window + launcher + [
           args.binary, args.nml, "train.epochs=100000", "train.log_every=0", "io.checkpoint_every=0",
           f"comm.timeout_s={args.timeout_s}", f"io.run_dir={run_dir}"] + backend
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    problems, stopped, left = [], None, []
    how = signal.SIGKILL if args.kill else signal.SIGSTOP
    try:
        deadline = time.time() + 120
        while metrics_lines(run_dir) < 3:  # training, validation and their collectives under way
            if p.poll() is not None or time.time() > deadline:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                reader.join(timeout=10)
                sys.stdout.write("".join(lines)[-5000:])  # why: a start-up error, or the GPU build without a device
                raise RuntimeError("the run did not reach 3 epochs (its output above)")
            time.sleep(0.05)
        ranks = {rank_of(c): c for c in children(p.pid)}
        if stop_rank not in ranks:
            raise RuntimeError(f"no process of rank {stop_rank} among mpiexec's children {ranks}")
        stopped = ranks[stop_rank]
        os.kill(stopped, how)
        t0 = time.time()
        limit = args.timeout_s + args.slack_s
        try:
            rc = p.wait(timeout=limit + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            problems.append(f"still running {limit + 30} s after the {how.name}")
        elapsed = time.time() - t0
        # The launcher ends its ranks as it ends: none may stay behind, the stopped one
        # included (SIGKILL ends a stopped process).
        gone_by = time.time() + 5
        while True:
            left = [r for r, pid in sorted(ranks.items()) if running(pid)]
            if not left or time.time() > gone_by:
                break
            time.sleep(0.1)
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(timeout=10)
    out = "".join(lines)
    hang = [l for l in out.splitlines() if ": hang: " in l]
    what = "killed" if args.kill else "stopped"
    print(f"rank {stop_rank} {what}: the job ended {elapsed:.1f} s later with exit status {rc}", flush=True)
    for l in hang:
        print("  " + l)
    if rc == 0:
        problems.append("exit status 0")
    if elapsed > limit:
        problems.append(f"ended {elapsed:.1f} s after the {how.name}, more than comm.timeout_s + {args.slack_s:g} = {limit} s")
    if left:
        problems.append(f"rank(s) {left} still running 5 s after the job ended")
    if args.kill:
        named = [l for l in out.splitlines()
                 if re.search(rf"\bprocess rank {stop_rank} with PID \d+ .*exited on signal 9\b", l)
                 or re.search(rf": hang: .*; not arrived: rank {stop_rank} \(", l)]
        for l in named:
            print("  named: " + l.strip())
        if not named:
            problems.append(f"no line names rank {stop_rank} (the launcher's 'process rank {stop_rank} with PID ... "
                            f"exited on signal 9', or a hang line's 'not arrived: rank {stop_rank}')")
    elif len(hang) != 1:
        problems.append(f"{len(hang)} 'hang:' lines, expected 1")
    others = [r for r in range(args.np) if r != stop_rank]
    arrived = ",".join(map(str, others)) if len(others) < 3 else f"{others[0]}-{others[-1]}"
    want = re.compile(rf"^rank ({'|'.join(map(str, others))}) \([^)]*\): hang: waited \d+ s "
                      rf"\(comm\.timeout_s = {args.timeout_s:g}\) in .+ at step \d+; "
                      rf"not arrived: rank {stop_rank} \((not running|no answer): stopped, or its node is gone[^)]*\); "
                      rf"waiting: ranks? {arrived}$")
    if args.no_window:
        want = re.compile(rf"^rank ({'|'.join(map(str, others))}) \([^)]*\): hang: waited \d+ s "
                          rf"\(comm\.timeout_s = {args.timeout_s:g}\) in .+ at step \d+; "
                          r"which ranks have not arrived is unknown \(no MPI one-sided window: .+\)$")
        if "watchdog: no MPI one-sided window across these ranks" not in out:
            problems.append("no 'watchdog: no MPI one-sided window' line")
    if args.gpu_build and args.backend == "nccl":
        if not re.search(r"^comm: NCCL on device buffers", out, re.M):
            problems.append("no line 'comm: NCCL on device buffers'")
    elif args.gpu_build:  # gradients in device memory: NCCL, or MPI staged through the host
        if not re.search(r"^comm: (NCCL on|MPI on|MPI,) device buffers", out, re.M):
            problems.append("no line saying how the GPU build reduces (NCCL, or MPI with device buffers)")
    elif args.no_window:
        if "gradients: no shared-memory window" not in out or "MPI during backward" not in out:
            problems.append("no line saying the gradients are summed by MPI, for want of a shared-memory window")
    elif "summed in a shared-memory window after backward" not in out:
        problems.append("no line saying the gradients are summed in a shared-memory window")
    if hang and not args.kill and not want.match(hang[0]):
        problems.append(f"the line does not match {want.pattern}")
    for bad in ("terminate called", "Backtrace", "Segmentation fault", "stack trace"):
        if bad in out:
            problems.append(f"'{bad}' in the output")
    if problems:
        sys.stdout.write(out[-5000:])
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mpiexec")
    ap.add_argument("binary")
    ap.add_argument("nml")
    ap.add_argument("prefix")
    ap.add_argument("--np", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--no-window", action="store_true")
    ap.add_argument("--gpu-build", action="store_true", help="ddp_train is the GPU build (no shared-memory reducer)")
    ap.add_argument("--launcher", help="a program each rank runs ddp_train through (tools/nccl_one_gpu)")
    ap.add_argument("--backend", choices=("mpi", "nccl"), help="comm.backend of the runs")
    ap.add_argument("--stop-rank", type=int, action="append", help="the rank to stop (or kill); repeatable")
    ap.add_argument("--kill", action="store_true", help="SIGKILL the rank instead of SIGSTOP")
    ap.add_argument("--slack-s", type=float, default=5.0, help="seconds allowed after comm.timeout_s")
    args = ap.parse_args()
    failures = []
    default = (args.np - 1,) if args.no_window or args.kill else (args.np - 1, 0)
    for stop_rank in args.stop_rank or default:
        name = "kill" if args.kill else "stop"
        problems = scenario(args, stop_rank, f"{args.prefix}_{name}{stop_rank}")
        failures += [f"{name.upper()} rank {stop_rank}: {p}" for p in problems]
    for f in failures:
        print("FAIL: " + f)
    if failures:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
