#!/usr/bin/env python3
"""TensorBoard scalars of a real 2-rank run, read back with the tensorboard package:

1. tiny.nml for 2 epochs with a progress line at every step: one events file in
   <run_dir>/tb (rank 0's), whose first record is the file version; train/loss at
   every step equals the progress line's loss (printed with 4 decimals) and train/lr
   its lr; the epoch scalars equal metrics.jsonl as float32 (train_loss, val_loss,
   val_acc, samples_per_s, lr) at its steps; step_time/* are metrics' phase seconds
   divided by the epoch's steps;
2. the run extended to 3 epochs (resumed) adds a second file; the directory then
   holds every epoch of metrics.jsonl once;
3. the run started again from epoch 1's checkpoint (io.resume = its path) trains
   epochs 2 and 3 again: their first records move to metrics_replaced.jsonl, with
   one line saying so, and TensorBoard, reading the three files, shows each epoch
   and each step once, the new run's (its file starts with a session start at step
   6, after which TensorBoard drops the older files' later steps);
4. a model of 7 outputs on the same data: epoch/val_acc5 equals metrics.jsonl's
   val_acc5, which tiny.nml's 3 outputs have in neither; with io.keep_best =
   'val_acc' there, epoch/best_val_acc is metrics.jsonl's best_val_acc (the best so
   far), which runs without keep_best have in neither.

usage: tensorboard_check.py MPIEXEC DDP_TRAIN INPUT RUN_DIR   (exit 77: no tensorboard)
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

try:
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"skipped: no tensorboard package ({e}); tools/install_deps --test makes /opt/ddp_train-venv")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_metrics import progress_lines  # noqa: E402

mpiexec, binary, nml, run_dir = sys.argv[1:5]
shutil.rmtree(run_dir, ignore_errors=True)
errors = []


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def run(epochs, *more, where=None):
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, nml, "train.log_every=1",
           f"train.epochs={epochs}", f"io.run_dir={where or run_dir}", *more]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    sys.stdout.write(p.stdout + p.stderr)
    if p.returncode != 0:
        fail(f"exit status {p.returncode}")
    if "io.tensorboard" in p.stderr:
        fail("a TensorBoard warning in a run that should write it")
    return p.stdout


def scalars(path):
    acc = EventAccumulator(path, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return acc, {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(x):
    return float(np.float32(x))


def expect(tag, got, want, tol=0.0):
    """got, want: [(step, value)]; equal steps, values within tol (0: float32-exact)."""
    if [s for s, _ in got] != [s for s, _ in want]:
        errors.append(f"{tag}: steps {[s for s, _ in got]}, expected {[s for s, _ in want]}")
        return
    for (s, g), (_, w) in zip(got, want):
        if (g != f32(w)) if tol == 0.0 else (abs(g - w) > tol):
            errors.append(f"{tag} at step {s}: {g!r} in TensorBoard, expected {w!r}")


out = run(2)
files = glob.glob(run_dir + "/tb/events.out.tfevents.*")
if len(files) != 1:
    fail(f"expected one events file in {run_dir}/tb (rank 0's), found {files}")
acc, tb = scalars(files[0])
if acc.file_version != 2.0:  # parsed from "brain.Event:2"
    errors.append(f"file_version {acc.file_version!r}, expected 2.0 ('brain.Event:2')")
records = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")]
reports, bad = progress_lines(out)
errors += bad
if len(reports) != records[-1]["step"]:
    errors.append(f"{len(reports)} progress lines for {records[-1]['step']} steps")
lrs = [float(m.group(1)) for m in re.finditer(r"^  epoch .*  lr (\S+)  ", out, re.M)]

expect("train/loss", tb.get("train/loss", []), [(r["step"], r["loss"]) for r in reports], tol=5e-5 + 1e-7)
got_lr = tb.get("train/lr", [])
expect("train/lr", got_lr, [(r["step"], lr) for r, lr in zip(reports, lrs)], tol=0.0005 * max(lrs + [1]))
if len(tb.get("train/samples_per_s", [])) != len(reports):
    errors.append("train/samples_per_s: not one per progress line")


def check_epochs(tb, records, top5=False):
    for key, tag in [("train_loss", "epoch/train_loss"), ("val_loss", "epoch/val_loss"),
                     ("val_acc", "epoch/val_acc"), ("samples_per_s", "epoch/samples_per_s"), ("lr", "epoch/lr")]:
        expect(tag, tb.get(tag, []), [(r["step"], r[key]) for r in records])
    # Top-5 accuracy is for more than 5 classes: tiny.nml's 3 have none, here or there.
    if top5:
        expect("epoch/val_acc5", tb.get("epoch/val_acc5", []), [(r["step"], r["val_acc5"]) for r in records])
    elif any("val_acc5" in r for r in records) or "epoch/val_acc5" in tb:
        errors.append("val_acc5 written for a model of 3 classes")
    # io.keep_best: the best so far, as metrics.jsonl's best_<metric>; none without it.
    best = sorted({k for r in records for k in r if k.startswith("best_val")})
    if best != sorted(t[len("epoch/"):] for t in tb if t.startswith("epoch/best_")):
        errors.append(f"best_* in metrics.jsonl {best}, in TensorBoard {[t for t in tb if 'best' in t]}")
    for key in best:
        expect("epoch/" + key, tb.get("epoch/" + key, []), [(r["step"], r[key]) for r in records])
    prev = 0
    for r in records:
        steps = r["step"] - prev
        prev = r["step"]
        for phase in ["data_wait", "forward", "backward", "comm", "optimizer"]:
            got = [v for s, v in tb.get("step_time/" + phase, []) if s == r["step"]]
            if got != [f32(r[phase + "_seconds"] / steps)]:
                errors.append(f"step_time/{phase} at step {r['step']}: {got}, expected "
                              f"{r[phase + '_seconds']} / {steps}")


check_epochs(tb, records)
if "epoch/loss_scale" in tb:
    errors.append("epoch/loss_scale written by an fp32 run")

time.sleep(1.1)  # the next file's name has another second
run(3)
files = glob.glob(run_dir + "/tb/events.out.tfevents.*")
if len(files) != 2:
    fail(f"the resumed run should add a second events file, found {files}")
records = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")]
_, tb = scalars(run_dir + "/tb")
check_epochs(tb, records)

time.sleep(1.1)
first = records[0]["step"]
before = records
out = run(3, f"io.resume={run_dir}/checkpoints/ckpt_{first:09d}.h5")
records = [json.loads(line) for line in open(run_dir + "/metrics.jsonl")]
replaced = [json.loads(line) for line in open(run_dir + "/metrics_replaced.jsonl")]
if [r["step"] for r in records] != [r["step"] for r in before] or records[0] != before[0]:
    errors.append(f"metrics.jsonl after the run from step {first}: steps {[r['step'] for r in records]}, "
                  f"expected {[r['step'] for r in before]} with the first record kept")
if replaced != before[1:]:
    errors.append(f"metrics_replaced.jsonl holds {replaced}, expected the records after step {first}: {before[1:]}")
said = (f"metrics: {len(before) - 1} records of {run_dir}/metrics.jsonl after step {first}, where this run starts, "
        f"moved to {run_dir}/metrics_replaced.jsonl: a run before this one trained those steps, and this one "
        f"trains them again")
if said not in out.splitlines():
    errors.append(f"no line {said!r}")
_, tb = scalars(run_dir + "/tb")
check_epochs(tb, records)
losses = [s for s, _ in tb.get("train/loss", [])]
if losses != list(range(1, records[-1]["step"] + 1)):
    errors.append(f"train/loss at steps {losses}, expected each of 1..{records[-1]['step']} once")

# 7 outputs for the 3 classes: top-5 accuracy in metrics.jsonl and TensorBoard alike.
top5_dir = run_dir + "_top5"
shutil.rmtree(top5_dir, ignore_errors=True)
run(3, "model.layers=linear(8),relu,linear(7)", "io.keep_best=val_acc", where=top5_dir)
top5_records = [json.loads(line) for line in open(top5_dir + "/metrics.jsonl")]
if not all(0 < r.get("val_acc5", 0) <= 1 for r in top5_records):
    errors.append(f"7 outputs: val_acc5 {[r.get('val_acc5') for r in top5_records]} in metrics.jsonl")
check_epochs(scalars(top5_dir + "/tb")[1], top5_records, top5=True)
accs = [r["val_acc"] for r in top5_records]
if [r.get("best_val_acc") for r in top5_records] != [max(accs[:i + 1]) for i in range(len(accs))] or len(set(accs)) < 2:
    errors.append(f"best_val_acc {[r.get('best_val_acc') for r in top5_records]} is not the best of val_acc {accs} so "
                  "far (or val_acc never changed, and this proves little)")

if errors:
    fail("\n  ".join(errors))
print(f"ok: {sum(len(v) for v in tb.values())} scalars in {len(tb)} tags match metrics.jsonl and the progress lines")
