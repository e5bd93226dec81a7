#!/usr/bin/env python3
"""A rank that stops answering (kill -STOP, as a node that hangs or a process stuck
in the kernel) must not leave the job waiting: the hang watchdog of a waiting rank
ends it within comm.timeout_s + 5 s, in one line that names the stopped rank as not
arrived (not running) and the others as waiting.

Scenarios, each a fresh run of NP ranks training a long tiny run: the stopped rank
is the last one, then rank 0 (which would otherwise be the one to report).

usage: hang.py MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [--np 3] [--timeout-s 5] [--no-window] [--gpu-build]

--no-window: Open MPI's osc/pt2pt only, which refuses MPI_THREAD_MULTIPLE, so the
watchdog has no window, as across hosts over TCP: the last rank is stopped, and the
line names the collective and the step, and says which ranks is unknown. Nor is
there a shared-memory window: the run says its gradients are summed by MPI. Without
--no-window they are summed in shared memory (all ranks on this machine), and the
waiting ranks' barriers there are what the watchdog must see through.
--gpu-build: the GPU build keeps gradients in device memory: the run names NCCL or
MPI with device buffers instead of either reducer line.
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


def metrics_lines(run_dir):
    try:
        return sum(1 for _ in open(os.path.join(run_dir, "metrics.jsonl")))
    except OSError:
        return 0


def scenario(args, stop_rank, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    no_window = ["--mca", "osc", "pt2pt"] if args.no_window else []
    cmd = [args.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(args.np)] + no_window + [args.binary, args.nml,
           "train.epochs=100000", "train.log_every=0", "io.checkpoint_every=0",
           f"comm.timeout_s={args.timeout_s}", f"io.run_dir={run_dir}"]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    problems, stopped = [], None
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
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.time()
        limit = args.timeout_s + 5
        try:
            rc = p.wait(timeout=limit + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            problems.append(f"still running {limit + 30} s after the STOP")
        elapsed = time.time() - t0
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
    print(f"rank {stop_rank} stopped: the job ended {elapsed:.1f} s later with exit status {rc}", flush=True)
    for l in hang:
        print("  " + l)
    if rc == 0:
        problems.append("exit status 0")
    if elapsed > limit:
        problems.append(f"ended {elapsed:.1f} s after the STOP, more than comm.timeout_s + 5 = {limit} s")
    if len(hang) != 1:
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
    if args.gpu_build:  # gradients in device memory: NCCL, or MPI staged through the host
        if not re.search(r"^comm: (NCCL on|MPI on|MPI,) device buffers", out, re.M):
            problems.append("no line saying how the GPU build reduces (NCCL, or MPI with device buffers)")
    elif args.no_window:
        if "gradients: no shared-memory window" not in out or "MPI during backward" not in out:
            problems.append("no line saying the gradients are summed by MPI, for want of a shared-memory window")
    elif "summed in a shared-memory window after backward" not in out:
        problems.append("no line saying the gradients are summed in a shared-memory window")
    if hang and not want.match(hang[0]):
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
    args = ap.parse_args()
    failures = []
    for stop_rank in (args.np - 1,) if args.no_window else (args.np - 1, 0):
        problems = scenario(args, stop_rank, f"{args.prefix}_stop{stop_rank}")
        failures += [f"STOP rank {stop_rank}: {p}" for p in problems]
    for f in failures:
        print("FAIL: " + f)
    if failures:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
