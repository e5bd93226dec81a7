#!/usr/bin/env python3
"""A checkpoint with NaN weights is never resumed from, on the tiny set and 2 ranks.

A 2-epoch run writes ckpt 5 and 10. Five weights of the newest become NaN and its
checksum is recomputed as ddp_train computes it (the file is intact, only its
values are not finite). Then:
1. io.resume = that file: one error line naming it and the non-finite values;
2. io.resume = 'auto': a warning names it, the run resumes from ckpt 5, trains
   epochs 2 and 3 and writes checkpoints with finite weights.

usage: nonfinite.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import os
import re
import shutil
import sys

import h5py
import numpy as np

from common import (arrays, computed_checksum, expect_one_error, fail, latest, mpirun, rewrite_checksum, run,
                    stored_checksum)

mpiexec, binary, nml, run_dir = sys.argv[1:5]
shutil.rmtree(run_dir, ignore_errors=True)
ckdir = os.path.join(run_dir, "checkpoints")
args = [nml, "train.log_every=0", f"io.run_dir={run_dir}"]

rc, _, _ = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=2"]))
if rc != 0:
    fail(f"2-epoch run exit status {rc}")
good, bad = os.path.join(ckdir, "ckpt_000000005.h5"), os.path.join(ckdir, "ckpt_000000010.h5")
if latest(run_dir) != os.path.basename(bad):
    fail(f"latest is {latest(run_dir)}, expected ckpt_000000010.h5")
# The test's checksum is ddp_train's, else the edit below would be a checksum mismatch.
if computed_checksum(bad) != stored_checksum(bad):
    fail(f"checksum computed here {computed_checksum(bad)} differs from the stored {stored_checksum(bad)}")

with h5py.File(bad, "r+") as f:
    w = f["model/layers.2.weight"]
    values = w[()]
    values.flat[[0, 3, 7, 11, 20]] = np.nan
    w[...] = values
rewrite_checksum(bad)
print(f"5 NaN in /model/layers.2.weight of {bad}, checksum rewritten: {stored_checksum(bad)}")

rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=3", f"io.resume={bad}"]))
expect_one_error(rc, out, err, rf"io.resume: checkpoint {re.escape(bad)} is unusable: "
                               r"/model/layers.2.weight has 5 non-finite values")

rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=3"]))
warn = rf"warning: checkpoint {re.escape(bad)} is unusable \(/model/layers.2.weight has 5 non-finite values"
if rc != 0 or not re.search(warn, err) or f"resumed from {good} at epoch 2" not in out:
    fail(f"resume 'auto' did not warn about {bad} and resume from {good} (exit {rc})")
final = os.path.join(ckdir, latest(run_dir))
if latest(run_dir) != "ckpt_000000015.h5" or not all(np.isfinite(a).all() for a in arrays(final).values()):
    fail(f"after the resume: latest {latest(run_dir)}, expected ckpt_000000015.h5 with finite values")
print("PASS")
