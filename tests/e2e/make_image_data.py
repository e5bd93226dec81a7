#!/usr/bin/env python3
"""Image shards for the augmentation e2e tests, written as h5py users write them.

usage: make_image_data.py OUT_DIR

OUT_DIR/nhwc/{train_0,train_1,val_0}.h5  uint8 (N, 12, 12, 3), /x layout = 'NHWC', class_names
OUT_DIR/nchw/...                         the same images (N, 3, 12, 12), no attribute
OUT_DIR/mixed/train_{0,1}.h5             one NHWC, one NCHW
OUT_DIR/sides/train_{0,1}.h5             12x12 and 10x10
OUT_DIR/float/train_0.h5                 float32 (N, 3, 12, 12)
Labels are learnable: class k brightens channel k.
"""
import os
import sys

import h5py
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(23)


def images(n, side, first):
    y = (np.arange(first, first + n) % 3).astype(np.int64)
    x = rng.integers(0, 160, size=(n, 3, side, side)).astype(np.uint8)
    for i in range(n):
        x[i, y[i]] += 90
    return x, y


def write(path, x_nchw, y, nhwc, attr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=x_nchw.transpose(0, 2, 3, 1) if nhwc else x_nchw)
        if attr:
            d.attrs["layout"] = "NHWC" if nhwc else "NCHW"
        f.create_dataset("y", data=y)
        f.attrs["format"] = "ddp_train.shard"
        f.attrs["version"] = 1
        f.attrs["class_names"] = ["red", "green", "blue"]


sets = {"train_0": images(40, 12, 0), "train_1": images(40, 12, 40), "val_0": images(24, 12, 80)}
for name, (x, y) in sets.items():
    write(f"{out}/nhwc/{name}.h5", x, y, True, True)
    write(f"{out}/nchw/{name}.h5", x, y, False, False)
write(f"{out}/mixed/train_0.h5", *sets["train_0"], True, True)
write(f"{out}/mixed/train_1.h5", *sets["train_1"], False, True)
write(f"{out}/sides/train_0.h5", *sets["train_0"], True, True)
write(f"{out}/sides/train_1.h5", *images(40, 10, 40), True, True)
os.makedirs(f"{out}/float", exist_ok=True)
with h5py.File(f"{out}/float/train_0.h5", "w") as f:
    x, y = sets["train_0"]
    f.create_dataset("x", data=x.astype(np.float32) / 255)
    f.create_dataset("y", data=y)
print(f"image shards in {out}")
