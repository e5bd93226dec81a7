#!/usr/bin/env python3
"""Small shard sets for the end-to-end tests of ddp_train, good and broken.

usage: make_test_data.py OUT_DIR
"""
import os
import sys

import h5py
import numpy as np


def shard(path, x, y):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "ddp_train.shard"
        f.attrs["version"] = 1
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(5)
    for d in ("tiny", "mismatch", "badlabels", "nothdf5", "nan"):
        os.makedirs(os.path.join(out, d), exist_ok=True)

    def sample(n, shape=(16,)):
        x = rng.standard_normal((n,) + shape).astype(np.float32)
        y = (x.reshape(n, -1)[:, :3].argmax(axis=1)).astype(np.int64)
        return x, y

    # 2 x 40 training samples, 25 validation samples, 3 classes.
    shard(os.path.join(out, "tiny", "train_000.h5"), *sample(40))
    shard(os.path.join(out, "tiny", "train_001.h5"), *sample(40))
    shard(os.path.join(out, "tiny", "val_000.h5"), *sample(25))
    # Shards whose sample shapes disagree.
    shard(os.path.join(out, "mismatch", "train_000.h5"), *sample(20, (16,)))
    shard(os.path.join(out, "mismatch", "train_001.h5"), *sample(20, (15,)))
    # A label outside the model's 3 classes, at sample 17 of the second shard.
    shard(os.path.join(out, "badlabels", "train_000.h5"), *sample(20))
    x, y = sample(20)
    y[17] = 7
    shard(os.path.join(out, "badlabels", "train_001.h5"), x, y)
    # The tiny set with non-finite pixels: NaN in rows 5 and 12 of the second
    # shard (global samples 45, 52), +inf in row 30 (global 70).
    x, y = sample(40)
    shard(os.path.join(out, "nan", "train_000.h5"), x, y)
    x, y = sample(40)
    x[5, 3] = x[12, 0] = np.nan
    x[30, 7] = np.inf
    shard(os.path.join(out, "nan", "train_001.h5"), x, y)
    # A file named like a shard that is not HDF5.
    with open(os.path.join(out, "nothdf5", "train_000.h5"), "w") as f:
        f.write("this is not an HDF5 file\n")


if __name__ == "__main__":
    main()
