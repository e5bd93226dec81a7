#!/usr/bin/env python3
"""Cadence: on the tiny set (2 ranks, batch 8: 5 steps per epoch) with
checkpoint_every = 0, checkpoint_every_steps = 2 and keep_checkpoints = 2, a 3-epoch
run (15 steps) writes steps 2, 4, ..., 14 and the final 15, and only the newest 2
remain; `latest` names the last; each file's /state matches its name and position.
Then checkpoint_every = 2 (epochs): epochs 2 and the final 3, keep 3: exactly 2 files.

usage: cadence.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import shutil
import os
import sys

from common import checkpoints, fail, latest, mpirun, run, state

mpiexec, binary, nml, run_dir = sys.argv[1:5]
shutil.rmtree(run_dir, ignore_errors=True)
rc, out, _ = run(mpirun(mpiexec, 2, binary, [nml, "train.epochs=3", "train.log_every=0", f"io.run_dir={run_dir}",
                                              "io.checkpoint_every=0", "io.checkpoint_every_steps=2",
                                              "io.keep_checkpoints=2"]))
if rc != 0:
    fail(f"exit status {rc}")
names = checkpoints(run_dir)
print(f"steps cadence: {names}, latest {latest(run_dir)}")
if names != ["ckpt_000000014.h5", "ckpt_000000015.h5"] or latest(run_dir) != "ckpt_000000015.h5":
    fail("expected exactly ckpt_000000014.h5 and ckpt_000000015.h5, latest the second")
s14 = state(os.path.join(run_dir, "checkpoints", names[0]))
s15 = state(os.path.join(run_dir, "checkpoints", names[1]))
print(f"step 14: {s14}\nstep 15: {s15}")
# step 14 = epoch 3 (index 2) after 4 of its 5 steps: 4 * 8 samples * 2 ranks = 64 positions.
if (s14["step"], s14["epoch"], s14["consumed"]) != (14, 2, 64) or (s15["step"], s15["epoch"], s15["consumed"]) != (15, 3, 0):
    fail("checkpoint states do not match their positions")

shutil.rmtree(run_dir, ignore_errors=True)
rc, out, _ = run(mpirun(mpiexec, 2, binary, [nml, "train.epochs=3", "train.log_every=0", f"io.run_dir={run_dir}",
                                              "io.checkpoint_every=2"]))
names = checkpoints(run_dir)
print(f"epoch cadence: {names}")
if rc != 0 or names != ["ckpt_000000010.h5", "ckpt_000000015.h5"]:
    fail("expected ckpt_000000010.h5 (epoch 2) and ckpt_000000015.h5 (final)")
print("PASS")
