#!/usr/bin/env python3
"""train.schedule = 'plateau' against torch.optim.lr_scheduler.ReduceLROnPlateau, on 2
ranks:

1. val_loss, 18 epochs, patience 1, relative threshold 0.05, cooldown 1, min_lr
   0.0005: each epoch's learning rate in metrics.jsonl is the one PyTorch's scheduler
   gives after step(val_loss) of the epochs before, fed the run's own val_loss values;
   the rate is reduced three times, down to min_lr, and no further where the run
   stalls on; each reduction, and nothing else, has its line;
2. val_acc (higher is better), the same: PyTorch's rates in its 'max' mode, reduced at
   least twice;
3. the val_loss run stopped just after its first reduction (cooldown running, in
   /state/plateau_cooldown): --check says where the schedule goes on; resumed, its
   records equal the straight run's, every field but the timings;
4. train.plateau_metric = 'val_acc5' on a model of 3 classes: one error line, exit 1.

usage: plateau_lr.py TORCH_PYTHON MPIEXEC DDP_TRAIN INPUT RUN_DIR
(TORCH_PYTHON computes PyTorch's rates in a process of its own)
"""
import json
import shutil
import subprocess
import sys

import h5py

torch_python, mpiexec, binary, nml, run_dir = sys.argv[1:6]
lr, factor, patience, threshold, cooldown, min_lr, epochs = 0.1, 0.1, 1, 0.05, 1, 0.0005, 18
plateau = ["train.schedule=plateau", f"train.lr={lr}", f"train.gamma={factor}", f"train.plateau_patience={patience}",
           f"train.plateau_threshold={threshold}", f"train.plateau_cooldown={cooldown}", f"train.min_lr={min_lr}"]
TIMINGS = ("samples_per_s", "seconds")


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def train(directory, n_epochs, *extra, fresh=True, code=0):
    if fresh:
        shutil.rmtree(directory, ignore_errors=True)
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, nml, *plateau, *extra,
           f"train.epochs={n_epochs}", f"io.run_dir={directory}"]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    sys.stdout.write(p.stdout[-3000:] + p.stderr[-2000:])
    if p.returncode != code:
        fail(f"exit status {p.returncode}, expected {code}")
    return p.stdout + p.stderr


def records(directory):
    return [json.loads(line) for line in open(directory + "/metrics.jsonl")]


def torch_rates(values, mode):
    """PyTorch's rate for each epoch: stepped with the epochs before's values."""
    code = f"""
import torch
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr={lr})
sch = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode={mode!r}, factor={factor}, patience={patience},
    threshold={threshold}, threshold_mode="rel", cooldown={cooldown}, min_lr={min_lr})
for v in {values!r}:
    print(repr(opt.param_groups[0]["lr"]))
    opt.step()
    sch.step(v)
"""
    p = subprocess.run([torch_python, "-c", code], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"PyTorch's ReduceLROnPlateau: {p.stderr[-800:]}")
    return [float(x) for x in p.stdout.split()]


def same(got, ref):
    return len(got) == len(ref) and all(abs(g - r) <= 1e-12 * r for g, r in zip(got, ref))


for metric, mode in (("val_loss", "min"), ("val_acc", "max")):
    directory = f"{run_dir}_{metric}"
    out = train(directory, epochs, f"train.plateau_metric={metric}")
    recs = records(directory)
    got = [r["lr"] for r in recs]
    want = torch_rates([r[metric] for r in recs], mode)
    print(f"{metric}: ddp_train {got}\n{' ' * len(metric)}  PyTorch   {want}")
    if [r["epoch"] for r in recs] != list(range(1, epochs + 1)) or not same(got, want):
        fail(f"{metric}: learning rates {got} by epoch; PyTorch's {want}")
    reductions = sum(1 for a, b in zip(got, got[1:]) if b < a)
    # a reduction decided after the last epoch has its line too
    lines = [l for l in out.splitlines() if l.startswith("plateau: lr ")]
    seen = [l for l in lines if int(l.split(" from epoch ")[1].split(":")[0]) <= epochs]
    if len(seen) != reductions or len(lines) > reductions + 1:
        fail(f"{metric}: {reductions} reductions, lines {lines}")
    if reductions < 2 or (metric == "val_loss" and (reductions != 3 or got[-1] != min_lr or got[-5:] != [min_lr] * 5)):
        fail(f"{metric}: {reductions} reductions to {got[-1]} (min_lr {min_lr}): this run proves too little")
    if metric == "val_loss":
        loss_recs, first = recs, next(i for i in range(1, epochs) if got[i] < got[i - 1])  # epoch `first` ran reduced
        want_line = (f"plateau: lr 0.1 -> 0.01 from epoch {first + 1}: val_loss has not improved on ")
        if not lines[0].startswith(want_line) or f"by more than {threshold:g} of it for" not in lines[0]:
            fail(f"the first reduction's line: {lines[0]!r}")

# 3. Stopped after the epoch that made the first reduction, in its cooldown, and resumed.
parts = run_dir + "_parts"
train(parts, first, "train.plateau_metric=val_loss")
with h5py.File(f"{parts}/checkpoints/ckpt_{loss_recs[first - 1]['step']:09d}.h5", "r") as f:
    state = {k: f["state"][k][()] for k in f["state"] if k.startswith("plateau_")}
if state.get("plateau_cooldown") != cooldown or state.get("plateau_lr") != lr * factor:
    fail(f"the checkpoint after epoch {first}: {state}; expected cooldown {cooldown}, rate {lr * factor}")
# --check says where the schedule goes on.
cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, "--check", nml, *plateau,
       "train.plateau_metric=val_loss", f"train.epochs={epochs}", f"io.run_dir={parts}"]
said = [l for l in subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.splitlines()
        if l.startswith("checkpoint: ")]
want = (f"checkpoint: would resume from {parts}/checkpoints/ckpt_{loss_recs[first - 1]['step']:09d}.h5 (epoch "
        f"{first + 1}, step {loss_recs[first - 1]['step']}); train.schedule = 'plateau' at lr {lr * factor:g} (best "
        f"val_loss {state['plateau_best']:.4f} at epoch {state['plateau_epoch']}; 0 epochs not better, 1 of cooldown)")
if said != [want]:
    fail(f"--check after epoch {first}: {said}; expected [{want!r}]")
train(parts, epochs, "train.plateau_metric=val_loss", fresh=False)
strip = lambda rs: [{k: v for k, v in r.items() if not any(t in k for t in TIMINGS)} for r in rs]
if strip(records(parts)) != strip(loss_recs):
    fail("stopped after epoch %d and resumed: its records differ from the straight run's" % first)
print(f"stopped after epoch {first} ({state}) and resumed: the straight run's records")

# 4. A metric the model has not.
out = train(run_dir + "_acc5", 1, "train.plateau_metric=val_acc5", code=1)
errors = [l for l in out.splitlines() if l.startswith("error")]
want = ("train.plateau_metric = 'val_acc5' needs top-5 accuracy, which models of more than 5 classes have; "
        "this one has 3: use 'val_acc' or 'val_loss'")
if len(errors) != 1 or not errors[0].endswith(want):
    fail(f"val_acc5 on 3 classes: {errors}")
print("PASS")
