#!/usr/bin/env python3
"""The e2e tiny shards as sequences, for a training run with attention.

usage: make_sequence_shards.py IN_DIR OUT_DIR T

Every shard IN_DIR/*.h5 (make_test_data.py's tiny set: /x (N, 16) float32, /y (N)
labels) is written to OUT_DIR with the same attributes, labels and numbers, /x
reshaped to (N, T, 16 / T): each sample's 16 values as T tokens of 16 / T features,
which ddp_train reads as a (T, d) sample. The shard format is the same; only the
sample's shape differs.
"""
import glob
import os
import sys

import h5py


def main():
    src, out, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    paths = sorted(glob.glob(os.path.join(src, "*.h5")))
    if not paths:
        sys.exit(f"no shards in {src}")
    for path in paths:
        with h5py.File(path, "r") as f, h5py.File(os.path.join(out, os.path.basename(path)), "w") as g:
            for k, v in f.attrs.items():
                g.attrs[k] = v
            x = f["x"][...]
            if x.ndim != 2 or x.shape[1] % T:
                sys.exit(f"{path}: /x {x.shape} is not (N, a multiple of {T})")
            g.create_dataset("x", data=x.reshape(x.shape[0], T, x.shape[1] // T))
            g.create_dataset("y", data=f["y"][...])
        print(f"{path} -> {out}: x {x.shape} as {(x.shape[0], T, x.shape[1] // T)}")


if __name__ == "__main__":
    main()
