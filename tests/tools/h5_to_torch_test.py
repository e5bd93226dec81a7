#!/usr/bin/env python3
"""tools/h5_to_torch against tools/torch_to_h5: torchvision's resnet18 and resnet50 (a
first stage without and with a downsample), a small VisionTransformer and an
nn.Sequential MLP, each with random weights (and running statistics), through
torch_to_h5 and back: the state_dict loads strictly into a new model of the class
and equals the original tensor for tensor. Then the refusals, one line each: a file
that is not HDF5, one without /model, a tensor the table has no name for.
(The GPT tables run in checkpoint_transformer_step_gpt_*, on ddp_train's checkpoints.)

usage: h5_to_torch_test.py TOOLS_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
from torch import nn
from torchvision.models import resnet18, resnet50
from torchvision.models.vision_transformer import VisionTransformer

tools = sys.argv[1]
work = tempfile.mkdtemp(prefix="h5_to_torch_test.")
torch.manual_seed(0)
failures = []


def tool(name, *args):
    p = subprocess.run([sys.executable, os.path.join(tools, name), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


def round_trip(label, make, names):
    net = make()
    with torch.no_grad():  # every tensor its own values, the statistics too
        for t in net.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.1)
            else:
                t.fill_(7)
    torch.save(net.state_dict(), f"{work}/{label}.pt")
    rc, out = tool("torch_to_h5", f"{work}/{label}.pt", f"{work}/{label}.h5")
    if rc != 0:
        failures.append(f"{label}: torch_to_h5 exited {rc}: {out}")
        return
    rc, out = tool("h5_to_torch", f"{work}/{label}.h5", f"{work}/{label}_back.pt", "--names", names)
    if rc != 0:
        failures.append(f"{label}: h5_to_torch exited {rc}: {out}")
        return
    back = make()
    try:
        back.load_state_dict(torch.load(f"{work}/{label}_back.pt"), strict=True)
    except RuntimeError as e:
        failures.append(f"{label}: the state_dict does not load strictly: {str(e)[:400]}")
        return
    want, got = net.state_dict(), back.state_dict()
    bad = [k for k in want if not torch.equal(want[k].to(got[k].dtype), got[k])]
    print(f"{label}: {len(want)} tensors, torch_to_h5 then h5_to_torch --names {names}: "
          f"{'equal' if not bad else 'differ: ' + ', '.join(bad[:4])}")
    if bad:
        failures.append(f"{label}: tensors differ after the round trip: {bad[:4]}")


round_trip("resnet18", lambda: resnet18(num_classes=7), "torchvision_resnet")
round_trip("resnet50", lambda: resnet50(num_classes=7), "torchvision_resnet")
round_trip("vit", lambda: VisionTransformer(image_size=16, patch_size=4, num_layers=3, num_heads=2, hidden_dim=8,
                                            mlp_dim=16, num_classes=5), "torchvision_vit")
round_trip("mlp", lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)), "sequential")

# Refusals: one line, exit 1.
with open(f"{work}/text.h5", "w") as f:
    f.write("not hdf5\n")
with h5py.File(f"{work}/empty.h5", "w") as f:
    f.create_group("state")
with h5py.File(f"{work}/odd.h5", "w") as f:
    f.create_dataset("model/layers.0.weight", data=np.zeros((4, 3, 2, 2), np.float32))
    f.create_dataset("model/layers.9.weight", data=np.zeros((4,), np.float32))
for path, names, want in [("text.h5", "sequential", "not an HDF5 file"),
                          ("empty.h5", "sequential", "no /model group"),
                          ("odd.h5", "torchvision_vit", "error: 9.weight: no torchvision VisionTransformer name")]:
    rc, out = tool("h5_to_torch", f"{work}/{path}", f"{work}/out.pt", "--names", names)
    lines = out.strip().splitlines()
    print(f"{path} --names {names}: exit {rc}: {out.strip()}")
    if rc != 1 or len(lines) != 1 or want not in lines[0] or os.path.exists(f"{work}/out.pt"):
        failures.append(f"{path}: exit {rc}, {out!r}; wanted one line with {want!r} and no file")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
shutil.rmtree(work)
print("PASS")
