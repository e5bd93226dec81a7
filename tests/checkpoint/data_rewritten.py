#!/usr/bin/env python3
"""A data file changed under a running job, on copies of the tiny set's shards, 2
ranks, streamed (data.mode = 'stream'), steps paced to 0.3 s (5 an epoch), 4 epochs,
a checkpoint each epoch. The change is made while the progress line of step 7
(epoch 2) is printed:

1. train_000.h5 written over in place with train_001.h5's bytes (`cp` over it: the
   same file, the same size, other samples): the run ends at epoch 2's end in one
   line naming the file, with exit 1, before epoch 2's line; metrics.jsonl holds
   epoch 1 alone and ckpt 5 stays the latest. Without the check it trained on,
   epoch 2 and after on samples it had not been given.
2. train_000.h5 truncated to 3,000 bytes in place: the same line, with 'now 3000
   bytes'. Without the check the batches read past its end were zeros, labels
   and all, and nothing said so.
3. train_000.h5 replaced by a rename (another file written, then renamed over it):
   the run reads on what it opened and ends 0 with the losses, epoch by epoch, of
   a straight run on the original files.

usage: data_rewritten.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR SHARD_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import threading

from common import expect_one_error, fail, latest, mpirun, progress_step, run

mpiexec, binary, nml, run_dir, shard_dir = sys.argv[1:6]
shutil.rmtree(run_dir, ignore_errors=True)
data = os.path.join(run_dir, "data")
os.makedirs(data)
shard = os.path.join(data, "train_000.h5")


def restore():
    for name in ("train_000.h5", "train_001.h5", "val_000.h5"):
        shutil.copy(os.path.join(shard_dir, name), data)


def args(where):
    return [nml, "train.log_every=1", "data.mode=stream", f"io.run_dir={where}", "train.epochs=4",
            f"data.train_files={data}/train_*.h5", f"data.val_files={data}/val_*.h5"]


def epochs(where):
    with open(os.path.join(where, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def run_changing(where, change):
    """Runs paced; calls change() once the progress line of step 7 is out."""
    cmd = mpirun(mpiexec, 2, binary, args(where))
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, DDP_TEST_STEP_DELAY_US="300000")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err = []
    reader = threading.Thread(target=lambda: err.extend(p.stderr))
    reader.start()
    out, changed = [], False
    for line in p.stdout:
        out.append(line)
        sys.stdout.write(line)
        if not changed and progress_step(line, 2) == 7:
            change()
            changed = True
            print(">>> changed the file", flush=True)
    rc = p.wait(timeout=120)
    reader.join()
    sys.stdout.write("".join(err))
    print(f"exit status {rc}", flush=True)
    if not changed:
        fail(f"{where}: no progress line of step 7")
    return rc, "".join(out), "".join(err)


# The straight run, for case 3's losses.
restore()
straight = os.path.join(run_dir, "straight")
rc, _, _ = run(mpirun(mpiexec, 2, binary, args(straight)), timeout=120)
if rc != 0:
    fail(f"the straight run: exit {rc}")
expected = [(e["epoch"], e["train_loss"], e["val_loss"]) for e in epochs(straight)]

for case, change, now in ((1, lambda: shutil.copyfile(os.path.join(shard_dir, "train_001.h5"), shard),
                           os.path.getsize(os.path.join(shard_dir, "train_001.h5"))),
                          (2, lambda: os.truncate(shard, 3000), 3000)):
    restore()
    where = os.path.join(run_dir, f"case{case}")
    rc, out, err = run_changing(where, change)
    line = expect_one_error(rc, out, err, rf"^error: data.train_files: {re.escape(shard)} was written over in "
                                          rf"place while this run read it \([0-9]+ bytes, modified .* UTC when "
                                          rf"opened; now {now} bytes, modified .* UTC\): .* rename them over the "
                                          r"old ones: the job reads on what it opened$")
    got = [e["epoch"] for e in epochs(where)]
    if rc != 1 or got != [1] or latest(where) != "ckpt_000000005.h5" or re.search(r"^epoch 2/4", out, re.M):
        fail(f"{case}. after the change: exit {rc} (expected 1 before epoch 2's line), metrics epochs {got} "
             f"(expected [1]), latest {latest(where)} (expected ckpt_000000005.h5)")
    print(f"{case}. the run ended at epoch 2's end in one line; epoch 1 alone in metrics.jsonl, ckpt 5 latest")

# 3. A rename over the file: the run reads on what it opened.
restore()
where = os.path.join(run_dir, "case3")


def rename_over():
    other = shard + ".new"
    shutil.copyfile(os.path.join(shard_dir, "train_001.h5"), other)
    os.replace(other, shard)


rc, out, err = run_changing(where, rename_over)
got = [(e["epoch"], e["train_loss"], e["val_loss"]) for e in epochs(where)]
if rc != 0 or "error:" in out + err or got != expected:
    fail(f"3. after a rename over the file: exit {rc}, epochs {got}, expected {expected} (the straight run's)")
print("3. a rename over the file: exit 0, the straight run's losses in every epoch")
print("PASS")
