#!/usr/bin/env python3
"""Checks the model parameters of a run's latest checkpoint by name and shape.

usage: check_checkpoint_params.py RUN_DIR NAME=SHAPE... [--trained NAME...]

NAME is a PyTorch state_dict key of the nn.Sequential ("2.weight"), stored as
/model/layers.NAME; SHAPE is its shape, "64" or "3x64". The checkpoint's parameters
must be exactly those (the names and shapes PyTorch's module has), all finite.
--trained NAME...: those must have moved from their initial value (layernorm's weight
from 1, its bias from 0; attention's in_proj_bias and out_proj.bias from 0), so the
run trained them.
"""
import argparse
import math
import os
import sys

import h5py
import numpy as np

INITIAL = {"weight": 1.0, "bias": 0.0, "in_proj_bias": 0.0}  # layernorm's init; attention's biases


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("params", nargs="+")
    p.add_argument("--trained", nargs="*", default=[])
    a = p.parse_args()
    ckpt_dir = os.path.join(a.run_dir, "checkpoints")
    with open(os.path.join(ckpt_dir, "latest")) as f:
        path = os.path.join(ckpt_dir, os.path.basename(f.read().strip()))
    want = []
    for item in a.params:
        name, shape = item.split("=")
        want.append(("layers." + name, tuple(int(d) for d in shape.split("x"))))
    errors = []
    with h5py.File(path, "r") as f:
        model = f["model"]
        got = [(k, model[k].shape) for k in model.keys() if isinstance(model[k], h5py.Dataset)]
        if sorted(got) != sorted(want):
            errors.append(f"parameters {got}, expected {want}")
        for name, _ in want:
            if name in model and not np.all(np.isfinite(model[name][...])):
                errors.append(f"{name} is not finite")
        for short in a.trained:
            name = "layers." + short
            if name not in model:
                continue
            v = model[name][...]
            init = INITIAL[short.rsplit(".", 1)[1]]
            moved = float(np.max(np.abs(v - init)))
            print(f"{name}: max |value - {init:g}| = {moved:.4g}")
            if not (math.isfinite(moved) and moved > 0):
                errors.append(f"{name} is still its initial value {init:g}")
    print(f"{path}: " + ", ".join(f"{n} {s}" for n, s in got))
    if errors:
        print("FAIL: " + "; ".join(errors))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
