#!/usr/bin/env python3
"""train.clip_grad_norm against torch.nn.utils.clip_grad_norm_: one SGD step (momentum
0.9) of a small conv + batch norm + linear model, on NP ranks, from PyTorch's random
weights (tools/torch_to_h5, io.init_from). PyTorch's reference takes each rank's batch
through the model in training mode (batch-norm statistics per rank, as without sync),
the loss the mean over all N samples, clip_grad_norm_(max_norm), then the step.
Debian's torch 1.13 clips as 2.x does: clip_coef = max_norm / (total_norm + 1e-6),
clamped to 1, and the gradients always multiplied by it. Three runs:

- max_norm below the norm (it clips): the weights after the step within 1e-6 of
  PyTorch's (||ours - torch|| / ||torch|| per tensor), metrics.jsonl's grad_norm
  PyTorch's returned total norm within 1e-6 relative, clipped_steps 1;
- max_norm above the norm: the same checks, clipped_steps 0, and the weights bitwise
  those of a third run without clipping (a coefficient of 1 changes no bit).

With further group.key=value arguments (comm.zero=2: the gradient norm from the
ranks' shares) every ddp_train run takes them too.

usage: clip_step.py NP MPIEXEC DDP_TRAIN TORCH_TO_H5 WORK_DIR [group.key=value ...]
"""
import json
import os
import shutil
import sys

import h5py
import numpy as np
import torch

from common import fail, latest, mpirun, run

nprocs, mpiexec, binary, torch_to_h5, work = int(sys.argv[1]), *sys.argv[2:6]
extra = sys.argv[6:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work + "/data")
N, LR, MOMENTUM, TOL = 16, 0.1, 0.9, 1e-6
torch.set_num_threads(1)

rng = np.random.default_rng(23)
x = rng.standard_normal((N, 1, 8, 8)).astype(np.float32)
y = rng.integers(0, 3, N).astype(np.int64)
with h5py.File(work + "/data/train_000.h5", "w") as f:
    f.attrs["format"] = "ddp_train.shard"
    f.attrs["version"] = 1
    f.create_dataset("x", data=x)
    f.create_dataset("y", data=y)
nml = work + "/cnn.nml"
with open(nml, "w") as f:
    f.write(f"""&data train_files = '{work}/data/train_*.h5', shuffle = F /
&model layers = 'conv2d(4, 3, pad=1)', 'batchnorm2d', 'relu', 'maxpool(2)', 'flatten', 'linear(3)' /
&train epochs = 1, batch_size = {N // nprocs}, optimizer = 'sgd', lr = {LR}, momentum = {MOMENTUM}, seed = 3,
       log_every = 1 /
""")

torch.manual_seed(11)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                          torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 3))
torch.save(net.state_dict(), work + "/model.pt")
weights = work + "/weights.h5"
if run(["/usr/bin/env", sys.executable, torch_to_h5, work + "/model.pt", weights])[0] != 0:
    fail("torch_to_h5 failed")
initial = {k: v.clone() for k, v in net.state_dict().items()}


def torch_step(max_norm):
    """PyTorch's weights after the step, and clip_grad_norm_'s total norm."""
    net.load_state_dict(initial)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    # Rank r trains samples r, r + NP, ... (unshuffled); the loss is their mean over all.
    loss = sum(torch.nn.functional.cross_entropy(net(X[r::nprocs]), Y[r::nprocs], reduction="sum")
               for r in range(nprocs)) / N
    opt.zero_grad()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm))
    opt.step()
    return {f"layers.{k}": v.detach().numpy().copy() for k, v in net.named_parameters()}, norm


def ours(name, *overrides):
    """The weights after ddp_train's step, and its one metrics record."""
    run_dir = f"{work}/{name}"
    rc, out, err = run(mpirun(mpiexec, nprocs, binary, [nml, f"io.init_from={weights}", f"io.run_dir={run_dir}",
                                                        *overrides, *extra]), timeout=120)
    if rc != 0:
        fail(f"{name}: ddp_train exited {rc}")
    records = [json.loads(l) for l in open(run_dir + "/metrics.jsonl")]
    with h5py.File(os.path.join(run_dir, "checkpoints", latest(run_dir)), "r") as f:
        got = {k: f["model"][k][()] for k in f["model"] if not k.split(".")[-1].startswith(("running", "num_"))}
    return got, records[-1], out


_, unclipped_norm = torch_step(1e9)
print(f"PyTorch's total gradient norm: {unclipped_norm:.9g}")
plain, _, _ = ours("plain")
for case, max_norm in (("clips", unclipped_norm / 4), ("does_not_clip", unclipped_norm * 4)):
    expect, torch_norm = torch_step(max_norm)
    got, record, out = ours(case, f"train.clip_grad_norm={max_norm!r}")
    rel = abs(record["grad_norm"] - torch_norm) / torch_norm
    print(f"{case} (max_norm {max_norm:.6g}): grad_norm ddp_train {record['grad_norm']:.9g}, PyTorch {torch_norm:.9g}"
          f" (relative difference {rel:.2e}), clipped_steps {record['clipped_steps']}")
    if not rel <= TOL:
        fail(f"{case}: grad_norm {record['grad_norm']} != PyTorch's {torch_norm}")
    if record["clipped_steps"] != (1 if case == "clips" else 0):
        fail(f"{case}: clipped_steps {record['clipped_steps']}")
    if "grad_norm" not in [l for l in out.splitlines() if "step 1 " in l][0]:
        fail(f"{case}: the progress line shows no grad_norm")
    if sorted(got) != sorted(expect):
        fail(f"tensors {sorted(got)} vs PyTorch's {sorted(expect)}")
    for k in sorted(expect):
        e, g = expect[k].astype(np.float64), got[k].astype(np.float64)
        d = float(np.linalg.norm(g - e) / np.linalg.norm(e))
        change = initial[k[len("layers."):]].numpy().astype(np.float64)
        moved = float(np.linalg.norm(e - change))  # 0 for the bias before a batch norm
        dc = f"{np.linalg.norm(g - e) / moved:.2e}" if moved > 0 else "n/a: no change"
        print(f"  {k} {g.shape}: relative difference {d:.2e} (of the step's change {dc})")
        if not d <= TOL:
            fail(f"{case}: {k} after the step differs from PyTorch's by {d:.2e} > {TOL}")
    if case == "does_not_clip":
        same = all(np.array_equal(got[k], plain[k]) for k in plain)
        print(f"  bitwise the run without clipping: {same}")
        if not same:
            fail("max_norm above the norm changed the step")
print("PASS")
