#!/usr/bin/env python3
"""Interop: the final checkpoint of a Fashion-MNIST MLP run loads with h5py into a
PyTorch nn.Sequential(Flatten, Linear, ReLU, Linear, ReLU, Linear) (state_dict keys
layers.<i>.weight|bias -> Sequential index i, strict), and its count of correct
test predictions equals the run's val_correct for that checkpoint's epoch, and its
count of labels among the 5 highest logits (torch.topk) the run's val_correct5.

usage: interop.py RUN_DIR TEST_SHARD_GLOB
"""
import glob
import json
import os
import sys

import h5py
import numpy as np
import torch

from common import fail, latest

run_dir, test_glob = sys.argv[1:3]
path = os.path.join(run_dir, "checkpoints", latest(run_dir))
with h5py.File(path, "r") as f:
    state = {k.replace("layers.", "", 1): torch.from_numpy(f["model"][k][()]) for k in f["model"]}
    step = int(f["state/step"][()])
    config = f.attrs["config"]
    config = config.decode() if isinstance(config, bytes) else config
print(f"{path}: step {step}, " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in sorted(state.items())))
if "'flatten', 'linear(256)', 'relu', 'linear(256)', 'relu', 'linear(10)'" not in config:
    fail("the config attribute does not hold the model's layers")

net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
net.load_state_dict(state, strict=True)
net.eval()

correct = correct5 = count = 0
for shard in sorted(glob.glob(test_glob)):
    with h5py.File(shard, "r") as f:
        x, y = f["x"][()], f["y"][()]
    x = torch.from_numpy(x.astype(np.float32) / np.float32(255.0)) if x.dtype == np.uint8 else torch.from_numpy(x)
    with torch.no_grad():
        logits = net(x)
    pred = logits.argmax(dim=1).numpy()
    top5 = logits.topk(5, dim=1).indices.numpy()
    correct += int((pred == y).sum())
    correct5 += int((top5 == y[:, None]).any(axis=1).sum())
    count += len(y)

records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
rec = [r for r in records if r["step"] == step][-1]
print(f"PyTorch: {correct}/{count} correct ({correct / count:.4f}); ddp_train: val_correct {rec['val_correct']}"
      f"/{rec['val_count']} (val_acc {rec['val_acc']}) at step {step}")
print(f"PyTorch: {correct5}/{count} in the top 5; ddp_train: val_correct5 {rec.get('val_correct5')}"
      f" (val_acc5 {rec.get('val_acc5')})")
if count != rec["val_count"] or correct != rec["val_correct"]:
    fail(f"PyTorch counts {correct} correct, ddp_train {rec['val_correct']}")
if correct5 != rec.get("val_correct5"):
    fail(f"PyTorch counts {correct5} in the top 5, ddp_train {rec.get('val_correct5')}")
print("PASS")
