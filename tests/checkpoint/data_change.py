#!/usr/bin/env python3
"""The data a run resumes on is checked against its checkpoint's record of the
training set, on the tiny set (2 shards of 40 samples) and 2 ranks.

A 1-epoch run on copies of the shards writes ckpt 5. Then:
1. train_001.h5 deleted: --check and the resume each end in one error line naming
   it and the counts (80 then, 40 now); with io.allow_data_change = T the resume
   warns and trains on the 40 samples;
2. train_001.h5 back with other values (the same 40 samples): --check warns that
   its contents differ and passes;
3. a checkpoint without the record (as written before it existed): --check warns
   once that the data cannot be checked, and passes.

usage: data_change.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR SHARD_DIR
"""
import os
import re
import shutil
import sys

import h5py
import numpy as np

from common import expect_one_error, fail, mpirun, rewrite_checksum, run

mpiexec, binary, nml, run_dir, shard_dir = sys.argv[1:6]
shutil.rmtree(run_dir, ignore_errors=True)
data = os.path.join(run_dir, "data")
os.makedirs(data)
for name in ("train_000.h5", "train_001.h5"):
    shutil.copy(os.path.join(shard_dir, name), data)
gone = os.path.join(data, "train_001.h5")
ckpt = os.path.join(run_dir, "checkpoints", "ckpt_000000005.h5")


def ddp(*extra, check=False, where=run_dir):
    args = [nml, "train.log_every=0", f"io.run_dir={where}", f"data.train_files={data}/train_*.h5", "train.epochs=2"]
    return run(mpirun(mpiexec, 2, binary, (["--check"] if check else []) + args + list(extra)))


rc, _, _ = run(mpirun(mpiexec, 2, binary, [nml, "train.log_every=0", f"io.run_dir={run_dir}",
                                            f"data.train_files={data}/train_*.h5", "train.epochs=1"]))
if rc != 0 or not os.path.exists(ckpt):
    fail(f"1-epoch run: exit status {rc}, {ckpt} written: {os.path.exists(ckpt)}")

# 1. A shard gone.
os.remove(gone)


def changed(run):
    ck = os.path.join(run, "checkpoints", "ckpt_000000005.h5")
    return (rf"the training data changed since checkpoint {re.escape(ck)} was written \(80 samples then, 40 now: "
            rf"{re.escape(gone)} \(40 samples\) is gone\)")


for check in (True, False):
    rc, out, err = ddp(check=check)
    expect_one_error(rc, out, err, changed(run_dir) + r".*io.allow_data_change = T")
    if "check passed" in out or "resumed from" in out:
        fail("it went on after the error")
allowed = run_dir + "_allowed"
shutil.rmtree(allowed, ignore_errors=True)
shutil.copytree(run_dir, allowed)
rc, out, err = ddp("io.allow_data_change=T", where=allowed)
if rc != 0 or not re.search("warning: " + changed(allowed) + r"; continuing on it", err) or "resumed from" not in out:
    fail(f"io.allow_data_change = T: no warning or no resume (exit {rc})")
print("1. a missing shard: an error for --check and the resume; a warning with io.allow_data_change = T")

# 2. The shard back, rewritten with other values of the same shape.
rng = np.random.default_rng(11)
with h5py.File(gone, "w") as f:
    x = rng.standard_normal((40, 16)).astype(np.float32)
    f.create_dataset("x", data=x)
    f.create_dataset("y", data=x[:, :3].argmax(axis=1).astype(np.int64))
rc, out, err = ddp(check=True)
if rc != 0 or "check passed" not in out or not re.search(
        rf"warning: the training data changed since checkpoint .* \({re.escape(gone)} has other contents", err):
    fail(f"rewritten shard: expected a warning and 'check passed' (exit {rc})")
print("2. a rewritten shard of the same size: a warning")

# 3. A checkpoint from before the record: no /data group (and a checksum to match).
with h5py.File(ckpt, "r+") as f:
    del f["data"]
rewrite_checksum(ckpt)
rc, out, err = ddp(check=True)
if rc != 0 or "check passed" not in out or err.count("has no record of its training data") != 1:
    fail(f"checkpoint without a record: expected one warning and 'check passed' (exit {rc})")
print("3. a checkpoint without a record: one warning")
print("PASS")
