#!/usr/bin/env python3
"""Any world size: Fashion-MNIST on 2 ranks, stopped by SIGUSR1 mid-epoch (signalled
from 1.2 epochs on; an epoch takes under half a second, so the stop may land in
epoch 2 or 3), resumed on 3 ranks to the end of epoch 4. With io.trace_samples every
rank writes the global sample indices it trained; across both runs every sample of
the stopped epoch is trained exactly once, plus the padding the 3-rank remainder
needs (counted twice: the first `pad` samples of the epoch's permutation, as
DistributedSampler pads). Every other epoch uses every sample exactly once, plus
its own padding where its rank count does not divide the set (one shard of 10,000
under the sanitizers: 2 samples twice on 3 ranks; none in the whole set). Final
val_acc >= MIN_ACC.
The cosine learning rate carries on across the resume (the schedule continues at
the same fraction of the epoch, not at the same step number, whose meaning changes
with the rank count): the last rate printed before the stop and the first after
the resume are a few steps apart on the curve.

usage: any_world_size.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR MIN_ACC [group.key=value ...]
The overrides go to both runs (another data set: its size is read from the run's
"data: N training samples" line; a language model's windows are its samples).
"""
import collections
import glob
import json
import os
import re
import shutil
import sys

from common import EX_TEMPFAIL, epoch_end_step, fail, latest, mpirun, progress_step, run, run_until, state

mpiexec, binary, nml, run_dir, min_acc = sys.argv[1:6]
shutil.rmtree(run_dir, ignore_errors=True)
EPOCHS = 4
args = [nml, f"train.epochs={EPOCHS}", "train.log_every=5", "io.trace_samples=.true.", f"io.run_dir={run_dir}"]
args += sys.argv[6:]

steps_per_epoch = [None]
LR = re.compile(r"^\s+epoch \d+/\d+ \d+%\s+step \d+\s.*?\slr (\S+)  ", re.M)  # grad_norm may follow


def stop_when(line):
    if steps_per_epoch[0] is None:
        steps_per_epoch[0] = epoch_end_step(line, 1)
        return False
    return (progress_step(line, 2) or 0) >= steps_per_epoch[0] * 1.2


rc, out, sent = run_until(mpirun(mpiexec, 2, binary, args), stop_when)
if not sent or rc != EX_TEMPFAIL:
    fail(f"2-rank run: signal sent {sent}, exit status {rc}, expected {EX_TEMPFAIL}")
size = re.search(r"^data: (\d+) training samples", out, re.M)
if not size:
    fail("no 'data: N training samples' line")
N = int(size.group(1))
stop = os.path.join(run_dir, "checkpoints", latest(run_dir))
st = state(stop)
C = st["consumed"]
S = st["epoch"] + 1  # the stopped epoch, 1-based
print(f"stopped: {stop} state {st}")
if not (S in (2, 3) and 0 < C < N and st["world_size"] == 2):
    fail(f"not stopped mid-epoch 2 or 3 on 2 ranks: {st}")

lr_before = LR.findall(out)[-1]
rc, out, _ = run(mpirun(mpiexec, 3, binary, args))
if rc != 0:
    fail(f"3-rank resumed run exit status {rc}")
lr_after = LR.findall(out)[0]
if f"resumed from {stop} at epoch {S} step {st['step']}" not in out or "continuing on 3" not in out:
    fail("no 'resumed from ... continuing on 3' line")


def counts(epoch):
    c = collections.Counter()
    files = sorted(glob.glob(os.path.join(run_dir, f"samples_rank*_epoch{epoch}.txt")))
    for f in files:
        c.update(int(x) for x in open(f).read().split())
    return c, files


errors = []
for epoch in (e for e in range(1, EPOCHS + 1) if e != S):
    expect_ranks = 2 if epoch < S else 3
    epoch_pad = (expect_ranks - N % expect_ranks) % expect_ranks  # DistributedSampler's, where W does not divide N
    c, files = counts(epoch)
    twice = sum(1 for v in c.values() if v == 2)
    if len(files) != expect_ranks or len(c) != N or not set(c.values()) <= {1, 2} or twice != epoch_pad:
        errors.append(f"epoch {epoch}: {len(files)} files, {len(c)} distinct samples, counts {set(c.values())}, "
                      f"{twice} trained twice (padding {epoch_pad})")

c2, files2 = counts(S)
pad = (3 - (N - C) % 3) % 3
trained = sum(c2.values())
twice = sorted(k for k, v in c2.items() if v == 2)
print(f"epoch {S}: {len(files2)} trace files, {trained} samples trained = {C} before the stop (2 ranks) + "
      f"{trained - C} after (3 ranks); {len(c2)} distinct; padding {pad} (samples trained twice: {len(twice)})")
if len(c2) != N or not set(range(N)) == set(c2):
    errors.append(f"epoch {S}: {N - len(c2)} samples never trained")
if trained != N + pad or len(twice) != pad or max(c2.values()) > 2:
    errors.append(f"epoch {S}: {trained} trained, expected {N} + padding {pad}")
for r in (0, 1):  # the 2-rank part: exactly C/2 samples per rank before the stop
    n = len(open(os.path.join(run_dir, f"samples_rank{r}_epoch{S}.txt")).read().split())
    expect = C // 2 + (N - C + pad) // 3
    if n != expect:
        errors.append(f"rank {r} epoch {S}: {n} samples, expected {C // 2} + {(N - C + pad) // 3}")

records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
print("metrics: " + "; ".join(f"epoch {r['epoch']} W={r['world_size']} val_acc {r['val_acc']}" for r in records))
sizes = [2] * (S - 1) + [3] * (EPOCHS - S + 1)
if [r["epoch"] for r in records] != list(range(1, EPOCHS + 1)) or [r["world_size"] for r in records] != sizes:
    errors.append(f"metrics records are not epochs 1..{EPOCHS} on {sizes} ranks")
elif not records[-1]["val_acc"] >= float(min_acc):
    errors.append(f"final val_acc {records[-1]['val_acc']} < {min_acc}")
print(f"learning rate: {lr_before} before the stop, {lr_after} after the resume")
if abs(float(lr_before) - float(lr_after)) > 0.003:
    errors.append(f"the learning rate jumps across the resume: {lr_before} -> {lr_after}")
if errors:
    fail("; ".join(errors))
print(f"PASS: epoch {S} = {C} samples on 2 ranks + {N - C} (+{pad} padding) on 3 ranks, each sample once; "
      f"final val_acc {records[-1]['val_acc']}")
