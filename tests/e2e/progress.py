#!/usr/bin/env python3
"""Progress lines with time left, on 2 ranks (the Fashion-MNIST MLP on 2 of the
training shards, long enough for the ETA's 0.1 s resolution on an idle machine):

1. a 2-epoch run: every progress line has the epoch fraction (growing within the
   epoch), a positive samples/s and the time left for the epoch and the run; the last
   line's run ETA is below the first's; every epoch line carries the run's (0.0s on
   the last); nothing but plain text (no control characters: the output is a pipe);
2. the same run extended to 3 epochs resumes at epoch 3: its lines say 3/3, its run
   ETA is the epoch's (one epoch left), and its first one is below 1.5 times the time
   that epoch then took (counting the 2 epochs done as well would make it about 3).

usage: progress.py MPIEXEC DDP_TRAIN INPUT RUN_DIR
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_metrics import epoch_lines, progress_errors, progress_lines  # noqa: E402

mpiexec, binary, nml, run_dir = sys.argv[1:5]
shutil.rmtree(run_dir, ignore_errors=True)
args = [nml, "data.train_files=data/fashion-mnist/train_00[01].h5", "train.log_every=50", f"io.run_dir={run_dir}"]


def run(epochs):
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary] + args + [f"train.epochs={epochs}"]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stdout.write(p.stdout + p.stderr)
    if p.returncode != 0:
        fail(f"exit status {p.returncode}")
    return p.stdout


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


out = run(2)
bad = sorted({c for c in out if ord(c) < 32 and c not in "\n\t"})
if bad:
    fail(f"control characters in the output of a run into a pipe: {bad}")
with open(run_dir + ".log", "w") as f:
    f.write(out)
records = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")]
errors = progress_errors(run_dir + ".log", records, eta_decreases=True)
if errors:
    fail("; ".join(errors))

out = run(3)
reports, errors = progress_lines(out)
if errors:
    fail("resumed run: " + "; ".join(errors))
if "resumed from" not in out or not reports:
    fail("the second run did not resume, or printed no progress line")
for r in reports:
    if (r["epoch"], r["epochs"]) != (3, 3) or abs(r["eta_run"] - r["eta_epoch"]) > 0.1:
        fail(f"resumed run on its last epoch: the run ETA must be the epoch's: {r['line']}")
record = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")][-1]
took = record["train_seconds"] + record["val_seconds"]
first = reports[0]
print(f"resumed run: first run ETA {first['eta_run']} s ({first['line']}); epoch 3 took {took:.2f} s")
if not first["eta_run"] < 1.5 * took + 0.1:
    fail(f"resumed run: run ETA {first['eta_run']} s at its start, but its one epoch took {took:.2f} s")
if [e[:2] for e in epoch_lines(out)] != [(3, 3)] or epoch_lines(out)[0][2] != 0:
    fail(f"resumed run's epoch lines: {epoch_lines(out)}")
print("PASS")
