#!/usr/bin/env python3
"""ZeRO checkpoints stay whole: the Fashion-MNIST MLP with AdamW (two state buffers),
2 epochs, a checkpoint every 200 steps.

1. On 3 ranks at comm.zero = 0 and at comm.zero = 2: every checkpoint of the two runs
   holds the same datasets, bit for bit (model, optimizer state and steps, training
   state): rank 0 gathers the shares into the layout plain data parallelism writes.
2. A zero = 2 run on 3 ranks stopped by SIGUSR1 40% into epoch 1 (exit 75 and its
   checkpoint), its run directory copied, resumes (io.resume = 'auto') at zero = 0
   on 2 ranks, and at zero = 1 and zero = 0 on 4 ranks. Each says it resumed from
   that checkpoint, trains every sample once across the stop and the resume (plus
   the padding the new rank count needs, as any_world_size.py counts with
   io.trace_samples), and ends epoch 2 with val_acc >= MIN_ACC; the zero = 1 run
   ends bitwise equal to the zero = 0 run on the same 4 ranks (every rank took its
   share of the file's state).
3. The zero = 2 run's last checkpoint loads into PyTorch by name and predicts the
   test set as the run counted (interop.py).

usage: zero_resume.py MPIEXEC DDP_TRAIN FASHION_MLP.nml WORK_DIR TEST_SHARD_GLOB
"""
import collections
import glob
import json
import os
import shutil
import subprocess
import sys

from common import (EX_TEMPFAIL, arrays, bitwise_equal, checkpoints, fail, latest, mpirun, progress_step, run,
                    run_until, state)

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

# 2. Stop a zero = 2 run on 3 ranks with SIGUSR1 (exit 75, its checkpoint) 40% into
# epoch 1, and resume copies of its run directory elsewhere.
N = 60000
STEPS = -(-N // (64 * 3))  # 313 steps per epoch on 3 ranks
stopped = f"{work}/stopped_z2_np3"
rc, out, sent = run_until(mpirun(mpiexec, 3, binary, base + ["comm.zero=2", "train.log_every=20",
                                                             "io.trace_samples=.true.", f"io.run_dir={stopped}"]),
                          lambda line: (progress_step(line, 1) or 0) >= 0.4 * STEPS)
if not sent or rc != EX_TEMPFAIL:
    fail(f"the zero = 2 run: signal sent {sent}, exit status {rc}, expected {EX_TEMPFAIL}")
stop_name = latest(stopped)
st = state(f"{stopped}/checkpoints/{stop_name}")
C = st["consumed"]
print(f"stopped: {stop_name}, state {st}")
if not (st["epoch"] == 0 and 0 < C < N and st["world_size"] == 3):
    fail(f"not stopped mid-epoch 1 on 3 ranks: {st}")


def samples(run_dir, epoch):
    c = collections.Counter()
    for f in glob.glob(os.path.join(run_dir, f"samples_rank*_epoch{epoch}.txt")):
        c.update(int(x) for x in open(f).read().split())
    return c


def resume(name, np_, zero):
    run_dir = f"{work}/{name}"
    shutil.copytree(stopped, run_dir)
    run_dir, out, records = train(name, np_, zero, ["io.trace_samples=.true."])
    if f"resumed from {run_dir}/checkpoints/{stop_name} at epoch 1 step {st['step']}" not in out:
        fail(f"{name}: no 'resumed from ...{stop_name} at epoch 1 step {st['step']}' line")
    # As any_world_size.py counts: the stopped epoch trains every sample once, plus the
    # padding the new rank count needs for the rest; the next epoch every sample once.
    pad = (np_ - (N - C) % np_) % np_
    c1, c2 = samples(run_dir, 1), samples(run_dir, 2)
    once = set(c2.values()) == {1} and len(c2) == N
    print(f"{name}: epoch 1 trained {sum(c1.values())} = {N} + padding {pad}, {len(c1)} distinct; epoch 2 "
          f"{sum(c2.values())}, {'each sample once' if once else 'NOT each sample once'}")
    if len(c1) != N or sum(c1.values()) != N + pad or max(c1.values()) > 2 or not once:
        fail(f"{name}: samples trained across the stop and resume are not each once (plus padding)")
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
