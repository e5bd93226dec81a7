#!/usr/bin/env python3
"""A full disk is recoverable: the run directory on a small tmpfs, the tiny set with
a wider model (checkpoints of ~180 KiB), 2 ranks. A filler file leaves half a
checkpoint free before each run:
1. the space is held by a temp file like the one a refused write left (the issue's
   requeued job that failed at once, forever): it is removed first, the run writes;
2. the space is held by another file: the oldest checkpoint goes, with a warning
   (never the newest valid one), the run writes;
3. nothing of ours to remove (io.keep_checkpoints = 1): one error line naming the
   file, 'No space left on device' and the free space; exit 1 on every rank; no
   temp file left, `latest` names the previous checkpoint; the same when that
   checkpoint is written in the background (io.checkpoint_async) and is not the
   run's last: the line comes at the next step;
4. the filler deleted (space freed): the next start resumes from that checkpoint;
5. short of space again with checkpoints/best.h5 (io.keep_best's link, made here by
   hand) naming the oldest checkpoint: the one after it goes instead, and the warning
   says the best stays.

Needs root for mount(8): skipped (exit 77) with the reason where it cannot mount.

usage: disk_full.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import os
import re
import shutil
import subprocess
import sys

from common import checkpoints, expect_one_error, fail, latest, mpirun, run

mpiexec, binary, nml, run_dir = sys.argv[1:5]
mnt = os.path.abspath(run_dir + "_tmpfs")


def free():
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def fill(path, leave):
    """Grows `path` until `leave` bytes are free on the tmpfs."""
    with open(path, "ab") as f:
        f.write(b"\0" * max(0, free() - leave))
    print(f"filler {os.path.basename(path)}: {os.path.getsize(path)} bytes, {free()} bytes free", flush=True)


subprocess.run(["umount", mnt], capture_output=True)  # a mount a killed run left
shutil.rmtree(run_dir, ignore_errors=True)
os.makedirs(mnt, exist_ok=True)
p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True, text=True)
if p.returncode != 0:
    print(f"SKIP: cannot mount a tmpfs on {mnt}: {p.stderr.strip()}")
    sys.exit(77)
try:
    run_in = os.path.join(mnt, "run")
    ckdir = os.path.join(run_in, "checkpoints")
    args = [nml, "train.log_every=0", f"io.run_dir={run_in}", "model.layers=linear(1024),relu,linear(3)"]

    def ddp(epochs, keep):
        return run(mpirun(mpiexec, 2, binary, args + [f"train.epochs={epochs}", f"io.keep_checkpoints={keep}"]),
                   timeout=120)

    rc, _, _ = ddp(1, 2)
    if rc != 0 or checkpoints(run_in) != ["ckpt_000000005.h5"]:
        fail(f"first run: exit {rc}, checkpoints {checkpoints(run_in)}")
    size = os.path.getsize(os.path.join(ckdir, "ckpt_000000005.h5"))
    print(f"a checkpoint takes {size} bytes; {free()} bytes free", flush=True)

    # 1. A temp file of an earlier attempt holds the space.
    stale = os.path.join(ckdir, "ckpt_000000010.h5.tmp.999999")
    fill(stale, size // 2)
    rc, out, err = ddp(2, 2)
    if rc != 0 or os.path.exists(stale) or checkpoints(run_in) != ["ckpt_000000005.h5", "ckpt_000000010.h5"]:
        fail(f"1. with a stale temp file: exit {rc}, it is still there: {os.path.exists(stale)}, "
             f"checkpoints {checkpoints(run_in)}")
    print("1. the stale temp file was removed first; ckpt 10 written")

    # 2. Another file holds the space: the oldest checkpoint makes room.
    filler = os.path.join(mnt, "filler")
    fill(filler, size // 2)
    rc, out, err = ddp(3, 1)
    warning = (r"warning: checkpoint: .* free and ckpt_000000015.h5 needs .*: removed the older ckpt_000000005.h5 "
               r"\(ckpt_000000010.h5, the newest valid checkpoint, stays\)")
    if rc != 0 or not re.search(warning, err) or checkpoints(run_in) != ["ckpt_000000015.h5"]:
        fail(f"2. short of space: exit {rc}, checkpoints {checkpoints(run_in)}, warning found: "
             f"{bool(re.search(warning, err))}")
    print("2. the oldest checkpoint made room, with a warning; ckpt 15 written")

    # 3. Nothing of ours left to remove: the write fails, the previous checkpoint stays.
    fill(filler, size // 2)
    rc, out, err = ddp(4, 1)
    target = os.path.join(ckdir, "ckpt_000000020.h5")
    expect_one_error(rc, out, err, rf"^error: cannot write checkpoint {re.escape(target)}: No space left on device "
                                   rf"\({re.escape(ckdir)} has [0-9.]+ KiB free, the checkpoint needs [0-9.]+ KiB\); "
                                   r"ckpt_000000015.h5 stays the latest$")
    left = sorted(os.listdir(ckdir))
    if rc != 1 or left != ["ckpt_000000015.h5", "latest"] or latest(run_in) != "ckpt_000000015.h5":
        fail(f"3. after the failed write: exit {rc} (expected 1), {ckdir} holds {left}, latest {latest(run_in)}")
    print("3. the write failed in one error line; no temp file; latest still ckpt 15")

    # 3b. The same in the background (io.checkpoint_async): epoch 4's checkpoint is not
    # the run's last, so its write fails on rank 0's thread; a step's agreement ends
    # every rank with the same line. Steps paced to 0.3 s: unpaced, epoch 5's 5 steps
    # took less than the thread's failing write on a loaded machine, and the failure
    # came at the final checkpoint (the same line, after epoch 5's).
    rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=5", "io.keep_checkpoints=1",
                                                          "io.checkpoint_async=T"]),
                       env=dict(os.environ, DDP_TEST_STEP_DELAY_US="300000"), timeout=120)
    expect_one_error(rc, out, err, rf"^error: cannot write checkpoint {re.escape(target)}: No space left on device "
                                   rf"\({re.escape(ckdir)} has [0-9.]+ KiB free, the checkpoint needs [0-9.]+ KiB\); "
                                   r"ckpt_000000015.h5 stays the latest$")
    left = sorted(os.listdir(ckdir))
    if rc != 1 or left != ["ckpt_000000015.h5", "latest"] or latest(run_in) != "ckpt_000000015.h5" or \
            re.search(r"^epoch 5/5", out, re.M):
        fail(f"3b. after the failed write in the background: exit {rc} (expected 1 before epoch 5 ended), "
             f"{ckdir} holds {left}, latest {latest(run_in)}")
    print("3b. in the background: the same line at the next step, exit 1; no temp file; latest still ckpt 15")

    # 4. Space freed: the next start resumes from the last good checkpoint.
    os.remove(filler)
    rc, out, err = ddp(4, 1)
    if rc != 0 or f"resumed from {os.path.join(ckdir, 'ckpt_000000015.h5')} at epoch 4" not in out or \
            latest(run_in) != "ckpt_000000020.h5":
        fail(f"4. after freeing space: exit {rc}, latest {latest(run_in)}")
    print("4. resumed from ckpt 15 and wrote ckpt 20")

    # 5. best.h5 names the oldest checkpoint: making room passes it over.
    rc, _, _ = ddp(6, 3)
    if rc != 0 or checkpoints(run_in) != ["ckpt_000000020.h5", "ckpt_000000025.h5", "ckpt_000000030.h5"]:
        fail(f"5. two more epochs, keep 3: exit {rc}, checkpoints {checkpoints(run_in)}")
    os.symlink("ckpt_000000020.h5", os.path.join(ckdir, "best.h5"))
    fill(filler, size // 2)
    rc, out, err = ddp(7, 3)
    warning = (r"warning: checkpoint: .* free and ckpt_000000035.h5 needs .*: removed the older ckpt_000000025.h5 "
               r"\(ckpt_000000030.h5, the newest valid checkpoint, stays; so does ckpt_000000020.h5, the best "
               r"\(best.h5\)\)")
    want = ["ckpt_000000020.h5", "ckpt_000000030.h5", "ckpt_000000035.h5"]
    if rc != 0 or not re.search(warning, err) or checkpoints(run_in) != want or \
            os.readlink(os.path.join(ckdir, "best.h5")) != "ckpt_000000020.h5":
        fail(f"5. short of space with best.h5: exit {rc}, checkpoints {checkpoints(run_in)} ({want}), "
             f"warning found: {bool(re.search(warning, err))}")
    print("5. the checkpoint after the best made room, with a warning; the best stays")
    print("PASS")
finally:
    subprocess.run(["umount", mnt])
