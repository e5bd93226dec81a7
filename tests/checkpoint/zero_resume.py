#!/usr/bin/env python3
"""ZeRO checkpoints stay whole: the Fashion-MNIST MLP with AdamW (two state buffers),
2 epochs, a checkpoint every 200 steps.

1. On 3 ranks at comm.zero = 0 and at comm.zero = 2: every checkpoint of the two runs
   holds the same datasets, bit for bit (model, optimizer state and steps, training
   state): rank 0 gathers the shares into the layout plain data parallelism writes.
2. The zero = 2 run's step-200 checkpoint (mid epoch 1), copied into new run
   directories, resumes (io.resume = 'auto') at zero = 0 on 2 ranks, and at zero = 1
   and zero = 0 on 4 ranks. Each says it resumed at step 200 and ends epoch 2 with
   val_acc >= MIN_ACC; the zero = 1 run ends bitwise equal to the zero = 0 run on
   the same 4 ranks (every rank took its share of the file's state). That a resume
   on another rank count trains every sample once is any_world_size.py's.
3. The zero = 2 run's last checkpoint loads into PyTorch by name and predicts the
   test set as the run counted (interop.py).

usage: zero_resume.py MPIEXEC DDP_TRAIN FASHION_MLP.nml WORK_DIR TEST_SHARD_GLOB
"""
import json
import os
import shutil
import subprocess
import sys

from common import arrays, bitwise_equal, checkpoints, fail, mpirun, run

mpiexec, binary, nml, work, test_glob = sys.argv[1:6]
MIN_ACC = 0.80
STEP = 200
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = [nml, "train.epochs=2", "train.optimizer=adamw", "train.lr=0.001", "train.log_every=0",
        f"io.checkpoint_every_steps={STEP}", "io.keep_checkpoints=20"]


def train(name, np_, zero, extra=()):
    run_dir = f"{work}/{name}"
    rc, out, err = run(mpirun(mpiexec, np_, binary, base + [f"comm.zero={zero}", f"io.run_dir={run_dir}", *extra]))
    if rc != 0:
        fail(f"{name}: exit {rc}")
    records = [json.loads(l) for l in open(run_dir + "/metrics.jsonl")]
    return run_dir, out, records


def groups(path):
    return arrays(path, groups=("model", "optimizer", "state"))


# 1. The same files at zero = 0 and 2 on 3 ranks.
a, _, _ = train("z0_np3", 3, 0)
b, out_b, rec_b = train("z2_np3", 3, 2)
if "ZeRO stage 2:" not in out_b:
    fail("the zero = 2 run printed no 'ZeRO stage 2:' line")
names_a, names_b = checkpoints(a), checkpoints(b)
if names_a != names_b or not names_a:
    fail(f"checkpoints differ: {names_a} against {names_b}")
for n in names_a:
    ok, report = bitwise_equal(groups(f"{a}/checkpoints/{n}"), groups(f"{b}/checkpoints/{n}"))
    print(f"{n}: zero=2 against zero=0 on 3 ranks: {'bitwise equal' if ok else report}")
    if not ok:
        fail(f"{n} written at zero = 2 differs from zero = 0's: {report}")

# 2. Resume the zero = 2 file elsewhere.
start = f"ckpt_{STEP:09d}.h5"
if start not in names_b:
    fail(f"no {start} among {names_b}")


def resume(name, np_, zero):
    run_dir = f"{work}/{name}"
    os.makedirs(f"{run_dir}/checkpoints")
    shutil.copy(f"{b}/checkpoints/{start}", f"{run_dir}/checkpoints/{start}")
    with open(f"{run_dir}/checkpoints/latest", "w") as f:
        f.write(start + "\n")
    run_dir, out, records = train(name, np_, zero)
    if f"resumed from {run_dir}/checkpoints/{start}" not in out or f" step {STEP} " not in out:
        fail(f"{name}: no 'resumed from ...{start} ... step {STEP}' line")
    last = records[-1]
    print(f"{name}: epoch {last['epoch']} step {last['step']} val_acc {last['val_acc']}")
    if last["epoch"] != 2 or last["world_size"] != np_ or last["val_acc"] < MIN_ACC:
        fail(f"{name}: final record {last}: expected epoch 2 on {np_} ranks, val_acc >= {MIN_ACC}")
    return run_dir


resume("resume_z0_np2", 2, 0)
d = resume("resume_z1_np4", 4, 1)
e = resume("resume_z0_np4", 4, 0)
last_d, last_e = checkpoints(d)[-1], checkpoints(e)[-1]
ok, report = bitwise_equal(groups(f"{d}/checkpoints/{last_d}"), groups(f"{e}/checkpoints/{last_e}"))
print(f"resumed on 4 ranks, {last_d}: zero=1 against zero=0: {'bitwise equal' if ok else report}")
if not ok:
    fail(f"resumed at zero = 1 on 4 ranks differs from zero = 0: {report}")

# 3. PyTorch reads the zero = 2 run's file as it reads any.
cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "interop.py"), b, test_glob]
print("$ " + " ".join(cmd), flush=True)
if subprocess.run(cmd).returncode != 0:
    fail("interop.py failed on the zero = 2 run's checkpoint")
print("PASS")
