#!/usr/bin/env python3
"""Augmented training runs (tests/e2e/images.nml: random_resized_crop, flip,
normalize, a centre-cropped validation), compared through their checkpoints:

1. NHWC shards and NCHW shards of the same images: the final checkpoints are
   bitwise identical (the same batches reach the model);
2. a run stopped mid-epoch (its checkpoint at step 3 of 5 per epoch) and resumed
   ends bitwise identical to the run that went straight through: each sample's
   augmentation is drawn from (seed, epoch, index), not from a stream a resume
   would have to restore;
3. 1 rank at batch 16 and 2 ranks at batch 8 train on the same augmented samples:
   the final parameters agree to float rounding (rtol 1e-4; the gradient sums'
   order differs), and the runs' first losses agree to 1e-5.

usage: augment_runs.py MPIEXEC DDP_TRAIN IMAGES.nml RUN_PREFIX
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
from common import arrays, bitwise_equal, checkpoints, fail, latest, mpirun, run  # noqa: E402

mpiexec, binary, nml, prefix = sys.argv[1:5]


def train(name, np_, *overrides):
    run_dir = f"{prefix}_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    rc, out, _ = run(mpirun(mpiexec, np_, binary, [nml, f"io.run_dir={run_dir}"] + list(overrides)))
    if rc != 0:
        fail(f"{name}: exit status {rc}")
    return run_dir, out


def final(run_dir):
    return os.path.join(run_dir, "checkpoints", latest(run_dir))


# 1. NHWC and NCHW shards of the same images.
nhwc, out = train("nhwc", 2)
if "uint8 NHWC, 3 class names, cropped to (3, 10, 10)" not in out:
    fail("rank 0's data line does not say the NHWC layout, the class names and the crop")
nchw, out = train("nchw", 2, "data.train_files=e2e_images/nchw/train_*.h5",
                  "data.val_files=e2e_images/nchw/val_*.h5")
if "uint8 NCHW" not in out:
    fail("rank 0's data line does not say the NCHW layout")
same, report = bitwise_equal(arrays(final(nhwc)), arrays(final(nchw)))
print(f"NHWC vs NCHW: {report}")
if not same:
    fail("NHWC and NCHW shards trained differently")

# 2. Stopped at step 3 (mid-epoch 1) and resumed from there.
straight, _ = train("straight", 2, "io.checkpoint_every_steps=3", "io.keep_checkpoints=10")
stop = os.path.join(straight, "checkpoints", "ckpt_000000003.h5")
if not os.path.exists(stop):
    fail(f"no checkpoint at step 3: {checkpoints(straight)}")
resumed, out = train("resumed", 2, "io.checkpoint_every_steps=3", "io.keep_checkpoints=10", f"io.resume={stop}")
if "resumed from" not in out:
    fail("the second run did not resume")
same, report = bitwise_equal(arrays(final(straight)), arrays(final(resumed)))
print(f"straight vs stopped at step 3 and resumed: {report}")
if not same:
    fail("the resumed run differs from the straight one")

# 3. 1 rank, batch 16 against 2 ranks, batch 8 (nhwc above).
one, _ = train("np1", 1, "train.batch_size=16")
a, b = arrays(final(one), ("model",)), arrays(final(nhwc), ("model",))
worst = max(float(np.max(np.abs(a[k] - b[k]) / (np.abs(b[k]) + 1e-3))) for k in a)
print(f"1 rank x 16 vs 2 ranks x 8: largest relative parameter difference {worst:.3g}")
if worst > 1e-4:
    fail("1 and 2 ranks trained on different samples")
losses = []
for d in (one, nhwc):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        losses.append([json.loads(line)["train_loss"] for line in f if "train_loss" in line])
print(f"train_loss per epoch: 1 rank {losses[0]}, 2 ranks {losses[1]}")
if abs(losses[0][0] - losses[1][0]) > 1e-5 * abs(losses[1][0]):
    fail("the first epoch's losses differ")
print("augmented runs agree")
