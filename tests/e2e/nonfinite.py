#!/usr/bin/env python3
"""train.nonfinite: NaN never reaches a checkpoint.

On the tiny set with NaN/inf pixels (make_test_data.py: e2e_data/nan, rows 5, 12 and
30 of train_001.h5), 2 ranks, a checkpoint after every step:

- 'stop': the run ends with exit 1 and exactly one `error:` line naming the step, the
  epoch, the shard and the row of a bad sample; no abort banner, no crash; every
  checkpoint left is finite and older than that step;
- 'skip': the run completes; each epoch skips 1 to 3 steps (the three bad samples)
  and says so in metrics.jsonl; the training loss stays finite; every checkpoint is
  finite;
- on clean data with train.lr = 1e30 the model diverges: exit 1, one line saying the
  inputs are finite and the model has diverged.

With train.cuda_graph=on among the overrides (the GPU build), the 'skip' run must
also have replayed steps from a CUDA graph: the check and the skip work under it.

usage: nonfinite.py MPIEXEC DDP_TRAIN TINY.nml RUN_PREFIX [group.key=value ...]
"""
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

NAN_FILES = "data.train_files=e2e_data/nan/train_*.h5"
BAD_ROWS = {5, 12, 30}  # of e2e_data/nan/train_001.h5; global samples 45, 52, 70


def run(args, run_dir, *overrides):
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [args[0], "--oversubscribe", "--allow-run-as-root", "-n", "2", args[1], args[2],
           f"io.run_dir={run_dir}", "io.checkpoint_every_steps=1", "io.keep_checkpoints=100", *overrides,
           *sys.argv[5:]]
    # The two streams apart: mpirun forwards them separately, in chunks, so one pipe
    # for both could split a line.
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    print(f"$ {' '.join(cmd)}\n{p.stdout}--- standard error\n{p.stderr}--- exit {p.returncode}")
    return p.returncode, p.stdout + p.stderr


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def checkpoints(run_dir):
    """(step, all /model and /optimizer values finite) of every checkpoint left."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt_*.h5"))):
        with h5py.File(path, "r") as f:
            finite = all(np.isfinite(f[g][k][()]).all() for g in ("model", "optimizer") for k in f[g])
            out.append((int(f["state/step"][()]), finite))
    return out


def one_error_line(out, regex):
    errors = [l for l in out.splitlines() if l.startswith("error:")]
    if len(errors) != 1:
        fail(f"{len(errors)} lines start with 'error:', expected 1")
    m = re.match(regex, errors[0])
    if not m:
        fail(f"the error line does not match /{regex}/")
    for bad in ("MPI_ABORT was invoked", "Process received signal", "terminate called", "exited on signal"):
        if bad in out:
            fail(f"'{bad}' in the output: expected a clean exit through MPI_Finalize")
    return m


def main():
    args = sys.argv[1:5]
    prefix = args[3]

    # 'stop' (the default).
    run_dir = prefix + "_stop"
    rc, out = run(args, run_dir, NAN_FILES)
    if rc != 1:
        fail(f"train.nonfinite = 'stop' exited {rc}, expected 1")
    m = one_error_line(out, r"error: rank [01]: non-finite loss at step (\d+) of epoch 1: the batch holds non-finite "
                            r"inputs: e2e_data/nan/train_001\.h5 rows? ([0-9, ]+) \(global samples? [0-9, ]+\); "
                            r"stopped without writing a checkpoint")
    step = int(m.group(1))
    rows = {int(r) for r in m.group(2).split(", ")}
    if not rows <= BAD_ROWS:
        fail(f"rows {sorted(rows)} named, but the bad rows are {sorted(BAD_ROWS)}")
    ckpts = checkpoints(run_dir)
    print(f"checkpoints left (step, finite): {ckpts}")
    if len(ckpts) != step - 1:
        fail(f"{len(ckpts)} checkpoints for the {step - 1} steps before the bad one")
    if not all(finite and s < step for s, finite in ckpts):
        fail("a checkpoint holds non-finite values or is not older than the bad step")

    # 'skip'.
    run_dir = prefix + "_skip"
    rc, out = run(args, run_dir, NAN_FILES, "train.nonfinite=skip")
    if rc != 0:
        fail(f"train.nonfinite = 'skip' exited {rc}, expected 0")
    if "train.cuda_graph=on" in sys.argv[5:]:
        replayed = [int(m.group(1)) for m in re.finditer(r"^CUDA graph: (\d+) of \d+ micro-batches", out, re.M)]
        print(f"micro-batches replayed from a CUDA graph, per epoch: {replayed}")
        if len(replayed) != 2 or replayed[-1] == 0:
            fail("no 'CUDA graph: N of M micro-batches' line per epoch with N > 0")
    records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    if len(records) != 2:
        fail(f"{len(records)} epochs in metrics.jsonl, expected 2")
    for r in records:
        if not 1 <= r.get("skipped_steps", 0) <= len(BAD_ROWS):
            fail(f"epoch {r['epoch']}: skipped_steps {r.get('skipped_steps')}, expected 1 to {len(BAD_ROWS)}")
        if r["train_loss"] is None or not math.isfinite(r["train_loss"]):
            fail(f"epoch {r['epoch']}: train_loss {r['train_loss']} is not finite")
    ckpts = checkpoints(run_dir)
    print(f"checkpoints (step, finite): {ckpts}")
    if not ckpts or not all(finite for _, finite in ckpts):
        fail("no checkpoint, or one with non-finite values")

    # A model that diverges on clean data.
    run_dir = prefix + "_diverged"
    rc, out = run(args, run_dir, "train.lr=1e30")
    if rc != 1:
        fail(f"a diverging run exited {rc}, expected 1")
    one_error_line(out, r"error: rank [01]: non-finite loss at step \d+ of epoch 1 on finite inputs .*: the model "
                        r"has diverged")
    if not all(finite for _, finite in checkpoints(run_dir)):
        fail("a checkpoint of the diverging run holds non-finite values")
    print("PASS")


if __name__ == "__main__":
    main()
