#!/usr/bin/env python3
"""Exactness: 3 epochs straight on 2 ranks, versus the same run stopped by a real
SIGUSR1 mid-epoch, from about 1.4 epochs on (exit status 75), and resumed: the final
checkpoints' /model and /optimizer datasets are bitwise identical. (An epoch takes
about half a second here, so the signal may land in epoch 2 or 3: any mid-epoch
stop will do.)

usage: exactness.py MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [group.key=value ...]
Leaves RUN_PREFIX_straight (used by the interop test) and RUN_PREFIX_resumed. The
overrides go to every run (train.precision=fp16: the loss scale's state, too, must
survive the stop).
"""
import json
import os
import shutil
import sys

from common import (EX_TEMPFAIL, arrays, bitwise_equal, epoch_end_step, fail, latest, mpirun, progress_step,
                    run, run_until, state)

mpiexec, binary, nml, prefix = sys.argv[1:5]
straight, resumed = prefix + "_straight", prefix + "_resumed"
for d in (straight, resumed):
    shutil.rmtree(d, ignore_errors=True)
common = [nml, "train.epochs=3", "train.log_every=5"] + sys.argv[5:]

rc, out, _ = run(mpirun(mpiexec, 2, binary, common + [f"io.run_dir={straight}"]))
if rc != 0:
    fail(f"straight run exit status {rc}")
steps_per_epoch = epoch_end_step(out, 1)
total = epoch_end_step(out, 3)

# Signal once past ~1.4 epochs (the signal takes a few steps to arrive).
threshold = steps_per_epoch + int(0.4 * steps_per_epoch)
rc, out, sent = run_until(mpirun(mpiexec, 2, binary, common + [f"io.run_dir={resumed}"]),
                          lambda line: (progress_step(line, 2) or 0) >= threshold)
if not sent or rc != EX_TEMPFAIL:
    fail(f"interrupted run: signal sent {sent}, exit status {rc}, expected {EX_TEMPFAIL}")
if "preempted: checkpoint" not in out or f"exit {EX_TEMPFAIL} for requeue" not in out:
    fail("no 'preempted: checkpoint ... exit 75 for requeue' line")
stop = os.path.join(resumed, "checkpoints", latest(resumed))
st = state(stop)
print(f"stopped: {stop} state {st}")
if not (st["epoch"] in (1, 2) and 0 < st["consumed"] < 60000):
    fail(f"the stop is not mid-epoch 2 or 3: {st}")

rc, out, _ = run(mpirun(mpiexec, 2, binary, common + [f"io.run_dir={resumed}"]))
if rc != 0:
    fail(f"resumed run exit status {rc}")
if f"resumed from {stop} at epoch {st['epoch'] + 1} step {st['step']}" not in out:
    fail("no 'resumed from ...' line naming the stop checkpoint")

a_path = os.path.join(straight, "checkpoints", latest(straight))
b_path = os.path.join(resumed, "checkpoints", latest(resumed))
if os.path.basename(a_path) != os.path.basename(b_path) or state(a_path)["step"] != total:
    fail(f"final checkpoints differ in step: {a_path} {b_path}")
same, report = bitwise_equal(arrays(a_path), arrays(b_path))
print(f"final checkpoints {a_path} vs {b_path}: {report}")
if not same:
    fail("parameters or optimizer state differ")
scales = [(state(p).get("loss_scale"), state(p).get("loss_scale_clean_steps")) for p in (a_path, b_path)]
print(f"loss scale, clean steps: straight {scales[0]} resumed {scales[1]}")
if scales[0] != scales[1]:
    fail("the loss scale state differs")
ma = [json.loads(l) for l in open(os.path.join(straight, "metrics.jsonl"))]
mb = [json.loads(l) for l in open(os.path.join(resumed, "metrics.jsonl"))]
print(f"val_acc straight {ma[-1]['val_acc']} resumed {mb[-1]['val_acc']}; "
      f"train_loss last epoch straight {ma[-1]['train_loss']!r} resumed {mb[-1]['train_loss']!r}")
if len(mb) != 3 or ma[-1]["val_correct"] != mb[-1]["val_correct"] or ma[-1]["val_loss"] != mb[-1]["val_loss"]:
    fail("validation metrics differ")
if abs(ma[-1]["train_loss"] - mb[-1]["train_loss"]) > 1e-9 * abs(ma[-1]["train_loss"]):
    fail("last epoch train_loss differs")
print(f"PASS: stopped at step {st['step']} of {total} ({st['step'] / steps_per_epoch:.2f} epochs), "
      "resumed, final parameters bitwise identical")
