#!/usr/bin/env python3
"""Crash safety, on the tiny data set and 2 ranks.

1. Epoch 1 trains and checkpoints (ckpt A). Epoch 2 runs with the test hook
   DDP_TEST_CHECKPOINT_DELAY_MS, which holds rank 0 between the fsync of the temp
   file ckpt_<step>.h5.tmp.<pid> and its rename; the test SIGKILLs that pid (rank 0)
   while the temp file exists. A is still valid and `latest` still names it; the
   next run resumes from A.
2. The newest checkpoint with flipped bytes inside a dataset: the checksum catches
   it, a warning names the file, the previous one is used, and the resumed run ends
   bitwise where the undamaged run ended.
3. The newest checkpoint truncated to half: same.

usage: crash_safety.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

from common import arrays, bitwise_equal, checkpoints, fail, latest, mpirun, run, state

mpiexec, binary, nml, run_dir = sys.argv[1:5]
shutil.rmtree(run_dir, ignore_errors=True)
ckdir = os.path.join(run_dir, "checkpoints")
args = [nml, "train.log_every=0", f"io.run_dir={run_dir}"]

rc, out, _ = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=1"]))
if rc != 0:
    fail(f"epoch-1 run exit status {rc}")
a_name = latest(run_dir)
a = os.path.join(ckdir, a_name)
a_arrays = arrays(a)

# 1. SIGKILL rank 0 in the middle of writing the next checkpoint.
env = dict(os.environ, DDP_TEST_CHECKPOINT_DELAY_MS="60000")
cmd = mpirun(mpiexec, 2, binary, args + ["train.epochs=2"])
print("$ DDP_TEST_CHECKPOINT_DELAY_MS=60000 " + " ".join(cmd), flush=True)
p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
tmp, deadline = None, time.time() + 120
while tmp is None and time.time() < deadline and p.poll() is None:
    found = glob.glob(os.path.join(ckdir, "ckpt_*.h5.tmp.*"))
    tmp = found[0] if found else None
    time.sleep(0.05)
if tmp is None:
    p.kill()
    fail("no temp checkpoint file appeared")
pid = int(tmp.rsplit(".", 1)[1])
os.kill(pid, signal.SIGKILL)
print(f">>> SIGKILL to rank 0 (pid {pid}) while {tmp} exists", flush=True)
rc = p.wait(timeout=120)
print(p.stdout.read())
print(f"killed run: exit status {rc}")
if rc == 0:
    fail("the killed run exited 0")
if latest(run_dir) != a_name or checkpoints(run_dir) != [a_name]:
    fail(f"after the kill: latest {latest(run_dir)}, checkpoints {checkpoints(run_dir)}; expected only {a_name}")
same, report = bitwise_equal(a_arrays, arrays(a))
if not same:
    fail("the previous checkpoint changed: " + report)
print(f"after the kill: {a_name} intact ({report}), latest names it, temp file {os.path.basename(tmp)} left over")

rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=2"]))
if rc != 0 or f"resumed from {a} at epoch 2" not in out:
    fail(f"the run after the kill did not resume from {a} (exit {rc})")
if glob.glob(os.path.join(ckdir, "*.tmp.*")):
    fail("the temp file of the killed writer was not removed")
b_name = latest(run_dir)
b = os.path.join(ckdir, b_name)
b_arrays = arrays(b)
print(f"resumed from {a_name} after the kill; wrote {b_name}")


def resume_past_broken(how):
    rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=2"]))
    warn = re.search(rf"warning: checkpoint {re.escape(b)} is unusable \((.*)\); trying the previous one", err)
    if rc != 0 or not warn or f"resumed from {a} at epoch 2" not in out:
        fail(f"{how}: no warning naming {b} or no resume from {a} (exit {rc})")
    same, report = bitwise_equal(b_arrays, arrays(b))
    if not same:
        fail(f"{how}: the re-trained epoch 2 differs: {report}")
    print(f"{how}: detected ({warn.group(1)}), resumed from {a_name}, re-wrote {b_name}: {report}")


# 2. Flip bytes in the middle of a dataset's data: HDF5 reads it, the checksum does not match.
with h5py.File(b, "r") as f:
    weight = f["model"][sorted(k for k in f["model"] if k.endswith(".weight"))[0]]
    offset = weight.id.get_offset() + weight.nbytes // 2
with open(b, "r+b") as f:
    f.seek(offset)
    raw = bytearray(f.read(8))
    f.seek(offset)
    f.write(bytes(x ^ 0xFF for x in raw))
resume_past_broken("flipped bytes")

# 3. Truncated newest checkpoint.
size = os.path.getsize(b)
with open(b, "r+b") as f:
    f.truncate(size // 2)
resume_past_broken("truncated")
print("PASS")
