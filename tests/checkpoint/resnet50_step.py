#!/usr/bin/env python3
"""One training step of inputs/resnet50_tiny.nml against torchvision's ResNet-50.

torchvision.models.resnet50(num_classes=10) with PyTorch's initial weights is saved,
tools/torch_to_h5 writes it as a weights-only file (torchvision's names mapped to the
layer list's positions), and ddp_train on NP ranks starts from it (io.init_from) for
one optimizer step over 16 uint8 64x64 RGB images (16 / NP a rank, unshuffled: rank r
takes samples r, r + NP, ...). The input file's own recipe is what both sides run:
data.normalize, SGD with momentum 0.875, weight decay not on batch-norm parameters
and biases (a second parameter group), label smoothing, the warm-up's first
learning rate.
The reference is PyTorch's step in float64 (the step's exact arithmetic); PyTorch's
own float32 step is computed beside it. Checked:
- the step's loss (metrics.jsonl's train_loss, the mean over every rank's samples)
  equals PyTorch's on the same per-rank batches (batch-norm statistics per rank, as
  without sync) to 5e-5 relative (PyTorch float32: 2.5e-6 to 1.2e-5 from float64);
- the whole step (every tensor's change: the weights', the same on every rank, and
  rank 0's running statistics'): ||ours - torch64|| / ||torch64|| <= 5e-3 and <= 3 x
  PyTorch float32's own (measured: 4.4-5.8e-4 against PyTorch float32's 4.2-7.4e-4,
  1 and 2 ranks);
- each tensor's change: the same ratio <= max(10 x PyTorch float32's, 1e-4). Neither
  float32 step comes closer than about 1e-2 in some tensors: a float32 rounding moves
  a few pre-ReLU values across zero, and at layer4's 2x2 maps each flip moves a
  visible share of a weight's gradient (measured: largest ddp_train 1.8-2.2e-2,
  PyTorch float32 1.7-3.1e-2; ratios up to 3.3).
The per-layer comparisons (tests/layers/torch_compare_test.cpp) hold every layer,
bottleneck included, to 1e-5 on the same inputs.

With --nhwc-too, ddp_train's step runs a second time with the activations kept
channels-last (DDP_CONV_LAYOUT=nhwc) and is held to the same checks.

usage: resnet50_step.py NP MPIEXEC DDP_TRAIN TORCH_TO_H5 INPUT_NML WORK_DIR [--nhwc-too]
"""
import copy
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys

import h5py
import numpy as np
import torch
import torchvision

from common import fail, latest, mpirun, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_bench import namelist_values  # noqa: E402

nprocs, mpiexec, binary, torch_to_h5, nml, work = int(sys.argv[1]), *sys.argv[2:7]
# --nhwc-too: a second ddp_train run with the activations channels-last
# (DDP_CONV_LAYOUT=nhwc, the GPU's bf16 layout, tested on the host) against the same
# PyTorch step.
layouts = [None] + (["nhwc"] if "--nhwc-too" in sys.argv[7:] else [])
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work + "/data")
N, SIDE, CLASSES = 16, 64, 10
TOTAL_MAX, TOTAL_RATIO, TENSOR_RATIO, FLOOR = 5e-3, 3.0, 10.0, 1e-4
LOSS_TOL = 5e-5
torch.manual_seed(5)
torch.set_num_threads(1)

rng = np.random.default_rng(17)
x = rng.integers(0, 256, (N, 3, SIDE, SIDE), dtype=np.uint8)
y = rng.integers(0, CLASSES, N).astype(np.int64)
for name in ("train_000", "val_000"):
    with h5py.File(f"{work}/data/{name}.h5", "w") as f:
        f.attrs["format"] = "ddp_train.shard"
        f.attrs["version"] = np.int64(1)
        f["x"], f["y"] = x, y

values = namelist_values(nml)
lr_peak = float(values["train.lr"])
warmup = int(values.get("train.warmup_steps", "0"))
lr = lr_peak / warmup if warmup > 0 else lr_peak  # schedule.cpp: step 0 of the warm-up
momentum = float(values["train.momentum"])
weight_decay = float(values["train.weight_decay"])
smoothing = float(values["train.label_smoothing"])
norm = [float(v) for v in values["data.normalize"].replace(",", " ").split()]
if values["train.decay_norm_and_bias"].strip().lower() not in ("f", ".false.", "false"):
    fail("the input file was expected to leave batch norms and biases out of weight decay")
print(f"recipe: normalize {norm}, lr {lr} (peak {lr_peak} / {warmup} warm-up steps), momentum {momentum}, weight decay "
      f"{weight_decay} on weights only, label smoothing {smoothing}")

net = torchvision.models.resnet50(num_classes=CLASSES)
torch.save(net.state_dict(), work + "/resnet50.pt")
before = {k: v.clone() for k, v in net.state_dict().items()}
weights = work + "/weights.h5"
rc, out, err = run(["/usr/bin/env", sys.executable, torch_to_h5, work + "/resnet50.pt", weights])
if rc != 0 or "torchvision ResNet names (16 blocks)" not in out:
    fail("torch_to_h5 did not write the torchvision ResNet-50 as the layer list's positions")

# PyTorch's step: each rank's batch in training mode (its own batch statistics), the
# loss the mean over all N samples, SGD on the summed gradients. In float64 (the
# reference: the step's exact arithmetic) and in float32 (for the record: Debian's
# PyTorch 1.13 on the CPU strays ~1e-2 from float64 in some weight updates of this net,
# where ddp_train stays within ~1e-5).
def torch_step(dtype):
    model = copy.deepcopy(net).to(dtype)
    model.train()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}], lr=lr, momentum=momentum)
    X = torch.from_numpy(x).to(dtype) / 255  # ToTensor's x / 255, then Normalize's (x - mean) / std
    X = (X - torch.tensor(norm[:3], dtype=dtype).view(1, 3, 1, 1)) / torch.tensor(norm[3:], dtype=dtype).view(1, 3, 1, 1)
    Y = torch.from_numpy(y)
    criterion = torch.nn.CrossEntropyLoss(reduction="sum", label_smoothing=smoothing)
    loss, stats0 = 0.0, None
    for r in range(nprocs):
        loss = loss + criterion(model(X[r::nprocs]), Y[r::nprocs])
        if r == 0:  # rank 0's running statistics, which the checkpoint holds
            stats0 = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    loss = loss / N
    opt.zero_grad()
    loss.backward()
    opt.step()
    state = model.state_dict()
    state.update(stats0)
    return loss.item(), {k: v.double().numpy() for k, v in state.items()}


torch_loss, state = torch_step(torch.float64)
torch32_loss, state32 = torch_step(torch.float32)

# torchvision's names -> the layer list's positions, as torch_to_h5 wrote them.
with h5py.File(weights, "r") as f:
    ours_names = list(f["model"])
torch_names = list(state)
if len(ours_names) != len(torch_names):
    fail(f"{len(ours_names)} tensors in the weights file, {len(torch_names)} in PyTorch's state_dict")
# The mapping torch_to_h5 applied, from torch_to_h5 itself (not a second copy of it).
loader = importlib.machinery.SourceFileLoader("torch_to_h5", torch_to_h5)
tool = importlib.util.module_from_spec(importlib.util.spec_from_loader("torch_to_h5", loader))
loader.exec_module(tool)
mapping = tool.torchvision_resnet_names(torch_names)


def check_run(layout):
    """ddp_train's step from PyTorch's weights, with DDP_CONV_LAYOUT=layout where one is
    given, against PyTorch's step."""
    tag = f" (DDP_CONV_LAYOUT={layout})" if layout else ""
    run_dir = work + "/run" + (f"_{layout}" if layout else "")
    cmd = mpirun(mpiexec, nprocs, binary,
                 [nml, f"data.train_files={work}/data/train_*.h5", f"data.val_files={work}/data/val_*.h5",
                  "data.shuffle=F", "train.epochs=1", f"train.batch_size={N // nprocs}", "train.log_every=1",
                  f"io.init_from={weights}", f"io.run_dir={run_dir}", "io.checkpoint_every=1"])
    rc, out, err = run(cmd, env=dict(os.environ, DDP_CONV_LAYOUT=layout) if layout else None, timeout=500)
    if rc != 0:
        fail(f"ddp_train{tag} exited {rc}")
    if layout == "nhwc":  # the model summary's layout column
        if " nhwc" not in out:
            fail("DDP_CONV_LAYOUT=nhwc, but the model summary shows no layer kept in nhwc:\n" + out)
        print("activations kept channels-last (nhwc), as the model summary shows")
    records = [json.loads(l) for l in open(run_dir + "/metrics.jsonl")]
    ours = records[0]["train_loss"]
    rel = abs(ours - torch_loss) / abs(torch_loss)
    print(f"first-step loss{tag}: ddp_train {ours:.9g}, PyTorch float64 {torch_loss:.9g} (relative difference "
          f"{rel:.2e}); PyTorch float32 {torch32_loss:.9g} ({abs(torch32_loss - torch_loss) / abs(torch_loss):.2e})")
    if records[0]["step"] != 1 or not rel <= LOSS_TOL:
        fail(f"first-step loss{tag} {ours} (step {records[0]['step']}) != PyTorch's {torch_loss}")

    with h5py.File(os.path.join(run_dir, "checkpoints", latest(run_dir)), "r") as f:
        got = {k: f["model"][k][()] for k in f["model"]}
    # Each tensor's change in the step (the update; the running statistics' change from
    # the file's values), ours against PyTorch's: max |ours - torch| / max |torch|.
    # Per tensor and over the whole model: ||ours - torch64|| / ||torch64|| of the change.
    worst_all, worst_name, worst32, ratio, bad = 0.0, "", 0.0, 0.0, []
    sums = {"ours": 0.0, "torch32": 0.0, "norm": 0.0}
    for name in torch_names:
        key = "layers." + mapping[name]
        if key not in got:
            fail(f"{key} ({name}) is not in the checkpoint{tag}")
        b = before[name].double().numpy()
        e, g, e32 = state[name] - b, np.asarray(got[key], np.float64) - b, state32[name] - b
        if np.shape(e) != np.shape(g):
            fail(f"{key} ({name}): shape {np.shape(g)}, PyTorch's {np.shape(e)}")
        norm = max(float(np.linalg.norm(e)), 1e-30)
        rel, rel32 = float(np.linalg.norm(e - g)) / norm, float(np.linalg.norm(e - e32)) / norm
        sums["ours"] += float(np.sum((e - g) ** 2))
        sums["torch32"] += float(np.sum((e - e32) ** 2))
        sums["norm"] += float(np.sum(e ** 2))
        if rel > worst_all:
            worst_all, worst_name, worst32 = rel, f"{key} ({name})", rel32
        ratio = max(ratio, rel / max(rel32, FLOOR))
        if not rel <= max(TENSOR_RATIO * rel32, FLOOR):
            bad.append(f"{key} ({name}): {rel:.2e}, PyTorch float32 {rel32:.2e}")
    if bad:
        fail(f"{len(bad)} tensors{tag} changed further from PyTorch float64's step than {TENSOR_RATIO:g} x PyTorch "
             "float32's own error: " + "; ".join(bad))
    total, total32 = (sums["ours"] / sums["norm"]) ** 0.5, (sums["torch32"] / sums["norm"]) ** 0.5
    print(f"the whole step{tag}: ||ours - torch64|| / ||torch64|| = {total:.2e}, PyTorch float32's {total32:.2e}")
    print(f"{len(torch_names)} tensors, each: ||ours - torch64|| / ||torch64|| of its change at most {ratio:.2f} x "
          f"PyTorch float32's (or {FLOOR:g}); the largest {worst_all:.2e} ({worst_name}; PyTorch float32 "
          f"{worst32:.2e})")
    if not total <= min(TOTAL_MAX, TOTAL_RATIO * total32):
        fail(f"the whole step{tag} is {total:.2e} from PyTorch float64's: more than {TOTAL_MAX:g}, or than "
             f"{TOTAL_RATIO:g} x PyTorch float32's")


for layout in layouts:
    check_run(layout)
print("PASS")
