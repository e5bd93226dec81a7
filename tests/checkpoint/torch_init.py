#!/usr/bin/env python3
"""io.init_from with PyTorch's weights: PyTorch builds the model the input file
describes (conv2d, batchnorm2d, relu, maxpool, flatten, linear), gives it random
weights and running statistics, torch.save's its state_dict, and tools/torch_to_h5
writes the weights-only file (a bare nn.Sequential's names, '0.weight'; h5py; no
/state, no /optimizer, no checksum), plus one tensor the model has no place for.
ddp_train on 2 ranks starts from it for one step (16 samples, 8 a rank, unshuffled:
rank r takes samples r, r+2, ...). Checked:
- the step's loss (metrics.jsonl's train_loss, the mean over both ranks' samples)
  equals PyTorch's on the same two per-rank batches (batch norm's statistics per
  rank, as without sync) to 1e-5 relative;
- the weights after the step and rank 0's running statistics equal PyTorch's after
  the same SGD step (so they were loaded, in PyTorch's layouts), num_batches_tracked
  counted on from the file's;
- the extra tensor is named in one warning line;
- a file with a tensor missing, and one with a tensor of another shape, end each
  rank with exit status 1 (as rank_status.py records it), within 60 s, and print one
  error line naming the tensor and both shapes.

usage: torch_init.py MPIEXEC DDP_TRAIN TORCH_TO_H5 WORK_DIR
"""
import json
import os
import re
import shutil
import sys
import time

import h5py
import numpy as np
import torch

from common import fail, latest, mpirun, run

mpiexec, binary, torch_to_h5, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work + "/data")
rng = np.random.default_rng(13)
N, LR = 16, 0.1


def shard(path, n):
    x = rng.standard_normal((n, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int64)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "ddp_train.shard"
        f.attrs["version"] = 1
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
    return x, y


x, y = shard(work + "/data/train_000.h5", N)
shard(work + "/data/val_000.h5", 8)
nml = work + "/cnn.nml"
with open(nml, "w") as f:
    f.write(f"""&data train_files = '{work}/data/train_*.h5', val_files = '{work}/data/val_*.h5', shuffle = F /
&model layers = 'conv2d(4, 3, pad=1)', 'batchnorm2d', 'relu', 'maxpool(2)', 'flatten', 'linear(3)' /
&train epochs = 1, batch_size = 8, optimizer = 'sgd', lr = {LR}, momentum = 0, seed = 3, log_every = 1 /
&io run_dir = '{work}/run' /
""")

torch.manual_seed(7)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                          torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(36, 3))
with torch.no_grad():  # not the defaults, so that loading them shows
    bn = net[1]
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-0.5, 0.5)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.num_batches_tracked.fill_(5)
torch.save(net.state_dict(), work + "/model.pt")
weights = work + "/weights.h5"
rc, out, err = run(["/usr/bin/env", sys.executable, torch_to_h5, work + "/model.pt", weights])
if rc != 0:
    fail("torch_to_h5 failed")
with h5py.File(weights, "a") as f:
    if list(f) != ["model"] or len(f.attrs):
        fail("torch_to_h5 wrote more than /model")
    f["model/9.weight"] = np.ones((2, 2), np.float32)  # no layer 9: ignored, with a warning

# PyTorch's step: each rank's batch through the model in training mode (its own batch
# statistics), the loss the mean over all 16, SGD on the averaged gradient.
ref = net
ref.train()
opt = torch.optim.SGD(ref.parameters(), lr=LR)
X, Y = torch.from_numpy(x), torch.from_numpy(y)
loss0 = torch.nn.functional.cross_entropy(ref(X[0::2]), Y[0::2], reduction="sum")
stats0 = {k: v.clone() for k, v in ref.state_dict().items() if k.startswith("1.running")}
loss1 = torch.nn.functional.cross_entropy(ref(X[1::2]), Y[1::2], reduction="sum")
loss = (loss0 + loss1) / N
opt.zero_grad()
loss.backward()
opt.step()
torch_loss = loss.item()

cmd = mpirun(mpiexec, 2, binary, [nml, f"io.init_from={weights}"])
rc, out, err = run(cmd, timeout=120)
if rc != 0:
    fail(f"ddp_train exited {rc}")
records = [json.loads(l) for l in open(work + "/run/metrics.jsonl")]
ours = records[0]["train_loss"]
rel = abs(ours - torch_loss) / abs(torch_loss)
print(f"first-step loss: ddp_train {ours:.9g}, PyTorch {torch_loss:.9g} (relative difference {rel:.2e})")
if records[0]["step"] != 1 or not rel <= 1e-5:
    fail(f"first-step loss {ours} (step {records[0]['step']}) != PyTorch's {torch_loss}")
warnings = [l for l in err.splitlines() if "warning" in l and "io.init_from" in l]
if len(warnings) != 1 or "9.weight (2,2)" not in warnings[0]:
    fail(f"expected one warning naming the ignored 9.weight, got {warnings}")

# After the step: the weights (all-reduced, the same on every rank) and rank 0's
# running statistics, from the checkpoint the run ends with.
expect = {f"layers.{k}": v.numpy() for k, v in ref.state_dict().items()}
expect.update({f"layers.{k}": v.numpy() for k, v in stats0.items()})
expect["layers.1.num_batches_tracked"] = np.float32(6)
with h5py.File(os.path.join(work, "run", "checkpoints", latest(work + "/run")), "r") as f:
    got = {k: f["model"][k][()] for k in f["model"]}
if sorted(got) != sorted(expect):
    fail(f"checkpoint tensors {sorted(got)} vs PyTorch's {sorted(expect)}")
for k in sorted(expect):
    e, g = np.asarray(expect[k], np.float64), np.asarray(got[k], np.float64)
    worst = float(np.max(np.abs(e - g) / (np.abs(e) + 1e-3))) if e.shape == g.shape else float("inf")
    print(f"{k} {g.shape}: max relative difference {worst:.2e}")
    if not worst <= 1e-4:
        fail(f"{k} after the step differs from PyTorch's")


RANK_STATUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_status.py")


def expect_error(name, edit, pattern):
    """A copy of the weights file changed by edit(f) must end each rank with exit
    status 1 (rank_status.py records each) and print one error line matching
    pattern, within 60 s."""
    bad = f"{work}/{name}.h5"
    shutil.copy(weights, bad)
    with h5py.File(bad, "a") as f:
        edit(f["model"])
    status_dir = f"{work}/status_{name}"
    os.makedirs(status_dir)
    start = time.time()
    rc, out, err = run(mpirun(mpiexec, 2, sys.executable, [RANK_STATUS, status_dir, binary, nml,
                                                            f"io.init_from={bad}", f"io.run_dir={work}/run_{name}"]),
                       timeout=60)
    lines = [l for l in (out + err).splitlines() if l.startswith("error:")]
    if rc != 1 or len(lines) != 1 or not re.search(pattern, lines[0]):
        fail(f"{name}: exit {rc}, error lines {lines}; expected one matching {pattern!r}")
    ranks = {r: open(f"{status_dir}/rank{r}").read().strip() if os.path.exists(f"{status_dir}/rank{r}") else None
             for r in range(2)}
    if ranks != {0: "1", 1: "1"}:
        fail(f"{name}: the ranks ended {ranks}, expected exit status 1 on each")
    if os.path.exists(f"{work}/run_{name}/metrics.jsonl"):
        fail(f"{name}: it trained")
    print(f"{name}: every rank exited 1, after {time.time() - start:.1f} s: {lines[0]}")


def misshape(g):
    del g["5.weight"]
    g["5.weight"] = np.zeros((3, 35), np.float32)


expect_error("missing", lambda g: g.__delitem__("0.bias"),
             r"^error: io.init_from: .*missing.h5 does not fit the model.*: layers.0.bias: expected shape \(4\), "
             r"found none")
expect_error("misshapen", misshape,
             r"^error: io.init_from: .*misshapen.h5 does not fit the model.*: layers.5.weight: expected shape "
             r"\(3,36\), found \(3,35\)")
print("PASS")
