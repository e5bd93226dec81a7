#!/usr/bin/env python3
"""train.schedule = 'multistep' against torch.optim.lr_scheduler.MultiStepLR:

1. 5 epochs on 2 ranks with milestones 1, 3 and gamma 0.1: each epoch's learning rate
   in metrics.jsonl is the one PyTorch's scheduler gives that epoch (stepped once an
   epoch, as its documentation does it), and it changes at each milestone;
2. the same run stopped after epoch 2 and resumed on 3 ranks (fewer steps an epoch):
   epochs 3 to 5 at PyTorch's rates still, the milestone at epoch 3 crossed after the
   resume.

usage: multistep_lr.py TORCH_PYTHON MPIEXEC DDP_TRAIN INPUT RUN_DIR
(TORCH_PYTHON computes PyTorch's rates in a process of its own)
"""
import json
import shutil
import subprocess
import sys

torch_python, mpiexec, binary, nml, run_dir = sys.argv[1:6]
milestones, gamma, lr, epochs = [1, 3], 0.1, 0.1, 5
schedule = ["train.schedule=multistep", f"train.milestones={','.join(map(str, milestones))}", f"train.gamma={gamma}",
            f"train.lr={lr}"]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def train(directory, ranks, n_epochs, fresh):
    if fresh:
        shutil.rmtree(directory, ignore_errors=True)
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks), binary, nml, *schedule,
           f"train.epochs={n_epochs}", f"io.run_dir={directory}"]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    sys.stdout.write(p.stdout[-2000:] + p.stderr[-2000:])
    if p.returncode != 0:
        fail(f"exit status {p.returncode}")
    return [json.loads(line) for line in open(directory + "/metrics.jsonl")]


# PyTorch's rates, epoch by epoch: the optimizer's lr while the epoch trains.
torch_code = f"""
import torch
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr={lr})
sch = torch.optim.lr_scheduler.MultiStepLR(opt, milestones={milestones}, gamma={gamma})
for _ in range({epochs}):
    print(repr(opt.param_groups[0]["lr"]))
    opt.step()
    sch.step()
"""
p = subprocess.run([torch_python, "-c", torch_code], capture_output=True, text=True, timeout=120)
if p.returncode != 0:
    fail(f"PyTorch's MultiStepLR: {p.stderr[-500:]}")
want = [float(x) for x in p.stdout.split()]
print(f"PyTorch MultiStepLR(milestones={milestones}, gamma={gamma}): {want}")
if len(want) != epochs or len(set(want)) != len(milestones) + 1:
    fail(f"PyTorch gave {want}: not {len(milestones) + 1} rates over {epochs} epochs")


def same(got, ref):
    return len(got) == len(ref) and all(abs(g - r) <= 1e-12 * r for g, r in zip(got, ref))


straight = train(run_dir, 2, epochs, fresh=True)
got = [r["lr"] for r in straight]
if [r["epoch"] for r in straight] != list(range(1, epochs + 1)) or not same(got, want):
    fail(f"2 ranks, straight: learning rates {got} by epoch; PyTorch's {want}")
print(f"straight run on 2 ranks: {got}")

parts = run_dir + "_parts"
train(parts, 2, 2, fresh=True)
resumed = train(parts, 3, epochs, fresh=False)
got = [r["lr"] for r in resumed]
if [r["epoch"] for r in resumed] != list(range(1, epochs + 1)) or not same(got, want):
    fail(f"2 epochs on 2 ranks, then resumed on 3: learning rates {got} by epoch; PyTorch's {want}")
print(f"2 epochs on 2 ranks, then 3 on 3 ranks: {got}")
print("PASS")
