#!/usr/bin/env python3
"""Stop-and-resume, many times, at random moments: the exit path of a preempted run
must be clean every time (exit 75, no sanitizer report, no glibc heap abort).

Each round starts a fresh NP-rank run that would train for long (train.epochs=100),
waits a random delay (uniform in [0, --max-delay] seconds, counted from rank 0's
first line, by which time every rank has its SIGUSR1 handler), sends SIGUSR1 to
mpiexec (which forwards it to the ranks), and requires exit status 75 and the
'preempted: checkpoint ... exit 75 for requeue' line. The delay lands anywhere:
data loading, mid-epoch, validation, an epoch-end checkpoint. Then (unless
--no-resume) it resumes from that checkpoint to the end of the stopped epoch and
requires exit status 0 and the 'resumed from' line. Rounds alternate
data.mode=preload and data.mode=stream (the prefetch thread).

Built with -DDDP_SANITIZE=ON (tools/sanitize_tests) this runs under
AddressSanitizer and UBSan; any report in the output (or in ASAN_OPTIONS'
log_path files) fails the round. Any build works; the normal build checks exit
codes and glibc's own heap checks.

usage: stop_stress.py MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [--runs 30] [--seed S]
                      [--max-delay 20] [--np 2] [--no-resume] [group.key=value ...]
Run directories are RUN_PREFIX_00, _01, ...; kept for a failed round, removed otherwise.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from common import EX_TEMPFAIL, latest, mpirun, state

# What sanitizers, glibc and the MPI runtime print when a process dies of a memory error.
REPORT = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer|"
                    r"free\(\): |double free|corrupted |malloc\(\): |munmap_chunk|Segmentation fault|"
                    r"exited on signal|Aborted")


def report_files():
    """Files that ASan/UBSan write their reports to when their options set log_path."""
    files = set()
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        m = re.search(r"(?:^|:)log_path=([^:]+)", os.environ.get(var, ""))
        if m:
            files.update(glob.glob(m.group(1) + ".*"))
    return files


def start(cmd):
    """Popen with a thread collecting its merged output; `banner` is set at rank 0's first line."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    p.lines, p.banner = [], threading.Event()

    def pump():
        for line in p.stdout:
            p.lines.append(line)
            if line.startswith("ddp_train "):
                p.banner.set()
        p.banner.set()  # the process ended before training started: let the waiter see it

    p.reader = threading.Thread(target=pump, daemon=True)
    p.reader.start()
    return p


def finish(p, timeout):
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        p.lines.append(f"stop_stress: killed after {timeout} s\n")
    p.reader.join()
    return rc, "".join(p.lines)


def stop_after(p, delay, timeout):
    """SIGUSR1 to mpiexec `delay` seconds from now unless the run has ended; then waits for it."""
    try:
        p.wait(timeout=delay)
        p.lines.append("stop_stress: the run ended before the signal\n")
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
    return finish(p, timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mpiexec")
    ap.add_argument("binary")
    ap.add_argument("nml")
    ap.add_argument("prefix")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None, help="of the delays (default: random, printed)")
    ap.add_argument("--max-delay", type=float, default=20.0, help="seconds after rank 0's first line")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per ddp_train run")
    ap.add_argument("--no-resume", action="store_true")
    args, overrides = ap.parse_known_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"stop_stress: {args.runs} rounds, delays uniform in [0, {args.max_delay}] s, seed {seed}", flush=True)

    failures, stops, resumes = [], 0, 0
    seen_reports = report_files()
    for i in range(args.runs):
        mode = ("preload", "stream")[i % 2]
        run_dir = f"{args.prefix}_{i:02d}"
        shutil.rmtree(run_dir, ignore_errors=True)
        common = [args.nml, f"data.mode={mode}", f"io.run_dir={run_dir}"] + overrides
        delay = rng.uniform(0.0, args.max_delay)
        problems = []

        t0 = time.time()
        p = start(mpirun(args.mpiexec, args.np, args.binary, common + ["train.epochs=100"]))
        p.banner.wait(timeout=args.timeout)
        rc, out = stop_after(p, delay, args.timeout)
        elapsed = time.time() - t0
        if rc != EX_TEMPFAIL:
            problems.append(f"exit status {rc}, expected {EX_TEMPFAIL}")
        if not re.search(rf"preempted: checkpoint \S+ written at step \d+; exit {EX_TEMPFAIL} for requeue", out):
            problems.append("no 'preempted: checkpoint ... exit 75 for requeue' line")
        where = ""
        if not problems:
            stops += 1
            stop = os.path.join(run_dir, "checkpoints", latest(run_dir))
            st = state(stop)
            where = f"step {st['step']} epoch {st['epoch'] + 1} consumed {st['consumed']}"
        print(f"round {i + 1:2d}/{args.runs}  {mode:7s}  SIGUSR1 after {delay:5.2f} s  exit {rc}  "
              f"{where or '-'}  ({elapsed:.1f} s)", flush=True)

        if not problems and not args.no_resume:
            # To the end of the stopped epoch: the resumed run's own exit path, and the load.
            cmd = mpirun(args.mpiexec, args.np, args.binary, common + [f"train.epochs={st['epoch'] + 1}"])
            q = start(cmd)
            rc2, out2 = finish(q, args.timeout)
            out += out2
            if rc2 != 0:
                problems.append(f"resumed run: exit status {rc2}, expected 0")
            elif f"resumed from {stop} at epoch {st['epoch'] + 1} step {st['step']}" not in out2:
                problems.append("resumed run: no 'resumed from' line naming the stop checkpoint")
            else:
                resumes += 1

        bad = [line for line in out.splitlines() if REPORT.search(line)]
        if bad:
            problems.append("report in the output: " + bad[0].strip())
        new_reports = report_files() - seen_reports
        seen_reports |= new_reports
        for f in sorted(new_reports):
            with open(f, errors="replace") as fh:
                text = fh.read()
            problems.append(f"sanitizer report {f}")
            sys.stdout.write(text)
        if problems:
            failures.append((i + 1, mode, delay, problems))
            sys.stdout.write(out)
            print(f"FAIL round {i + 1}: " + "; ".join(problems), flush=True)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)

    print(f"stop_stress: {args.runs} rounds (seed {seed}): {stops} stopped with exit {EX_TEMPFAIL}, "
          f"{resumes} resumed with exit 0, {len(failures)} failed", flush=True)
    for n, mode, delay, problems in failures:
        print(f"  round {n} ({mode}, {delay:.2f} s): " + "; ".join(problems))
    if failures:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
