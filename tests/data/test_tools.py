#!/usr/bin/env python3
"""Checks tools/make_regression_data and tools/prepare_fashion_mnist by running
them into temporary directories and reading back what they wrote.

usage: test_tools.py <repo root>    (exit 0: all checks passed)
"""
import gzip
import os
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = sys.argv[1]
FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)


def run(tool, *args, expect_rc=0):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), *args],
                       capture_output=True, text=True)
    check(r.returncode == expect_rc, f"{tool} {args}: exit {r.returncode}, expected {expect_rc}: {r.stderr}")
    return r


def check_shard(path, n, x_shape, x_dtype, y_shape, y_dtype):
    with h5py.File(path, "r") as f:
        fmt = f.attrs.get("format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        check(fmt == "ddp_train.shard", f"{path}: format attribute {fmt!r}")
        check(f.attrs.get("version") == 1, f"{path}: version attribute {f.attrs.get('version')!r}")
        check(f["x"].shape == (n, *x_shape), f"{path}: x shape {f['x'].shape}")
        check(f["x"].dtype == x_dtype, f"{path}: x dtype {f['x'].dtype}")
        check(f["y"].shape == (n, *y_shape), f"{path}: y shape {f['y'].shape}")
        check(f["y"].dtype == y_dtype, f"{path}: y dtype {f['y'].dtype}")
        check(f["x"].chunks is None and f["x"].compression is None, f"{path}: x must be contiguous")
        return f["x"][...], f["y"][...]


def test_regression(tmp):
    out = os.path.join(tmp, "reg")
    run("make_regression_data", out)
    data = {}
    for name, n in [("train_000.h5", 2048), ("train_001.h5", 2048), ("val_000.h5", 1000)]:
        data[name] = check_shard(os.path.join(out, name), n, (8,), np.float32, (1,), np.float32)
    x, y = data["train_000.h5"]
    check(np.isfinite(x).all() and np.isfinite(y).all(), "regression: non-finite values")
    check(0.2 < float(y.std()) < 5.0, f"regression: y std {y.std()} (a constant target is useless)")
    check(not np.array_equal(data["train_000.h5"][0], data["train_001.h5"][0]), "regression: shards identical")
    # Deterministic: a second run writes the same numbers.
    out2 = os.path.join(tmp, "reg2")
    run("make_regression_data", out2)
    with h5py.File(os.path.join(out2, "val_000.h5"), "r") as f:
        check(np.array_equal(f["x"][...], data["val_000.h5"][0]) and np.array_equal(f["y"][...], data["val_000.h5"][1]),
              "regression: not deterministic")


def write_idx(path, magic, arr):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">i", magic) + struct.pack(f">{arr.ndim}i", *arr.shape) + arr.tobytes())


def test_fashion(tmp):
    # A tiny fake data set in IDX format: 50 training and 20 test images.
    src = os.path.join(tmp, "idx")
    os.makedirs(src)
    rng = np.random.default_rng(0)
    imgs = {s: rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8) for s, n in [("train", 50), ("t10k", 20)]}
    labels = {s: rng.integers(0, 10, size=(n,), dtype=np.uint8) for s, n in [("train", 50), ("t10k", 20)]}
    for s in ("train", "t10k"):
        write_idx(os.path.join(src, f"{s}-images-idx3-ubyte.gz"), 2051, imgs[s])
        write_idx(os.path.join(src, f"{s}-labels-idx1-ubyte.gz"), 2049, labels[s])
    out = os.path.join(tmp, "fm")
    run("prepare_fashion_mnist", out, "--source", src, "--shards", "3")
    sizes = [17, 16, 17]  # linspace split of 50
    got_x, got_y = [], []
    for i in range(3):
        with h5py.File(os.path.join(out, f"train_{i:03d}.h5"), "r") as f:
            n = f["x"].shape[0]
        x, y = check_shard(os.path.join(out, f"train_{i:03d}.h5"), n, (1, 28, 28), np.uint8, (), np.int64)
        got_x.append(x)
        got_y.append(y)
    check(sum(len(y) for y in got_y) == 50, f"fashion: train shards hold {[len(y) for y in got_y]} samples")
    check(sorted(len(y) for y in got_y) == sorted(sizes), f"fashion: uneven split {[len(y) for y in got_y]}")
    check(np.array_equal(np.concatenate(got_x)[:, 0], imgs["train"]), "fashion: train images altered")
    check(np.array_equal(np.concatenate(got_y), labels["train"]), "fashion: train labels altered")
    x, y = check_shard(os.path.join(out, "test_000.h5"), 20, (1, 28, 28), np.uint8, (), np.int64)
    check(np.array_equal(y, labels["t10k"]), "fashion: test labels altered")
    check(not os.path.exists(os.path.join(out, "train_003.h5")), "fashion: extra shard")
    # Idempotent: complete outputs are left alone.
    before = os.path.getmtime(os.path.join(out, "train_000.h5"))
    r = run("prepare_fashion_mnist", out, "--source", src, "--shards", "3")
    check("already complete" in r.stdout, f"fashion: second run did not notice: {r.stdout!r}")
    check(os.path.getmtime(os.path.join(out, "train_000.h5")) == before, "fashion: second run rewrote a shard")
    # A corrupt IDX header is refused.
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    for s in ("train", "t10k"):
        write_idx(os.path.join(bad, f"{s}-images-idx3-ubyte.gz"), 2049, imgs[s])  # label magic on images
        write_idx(os.path.join(bad, f"{s}-labels-idx1-ubyte.gz"), 2049, labels[s])
    r = run("prepare_fashion_mnist", os.path.join(tmp, "fm_bad"), "--source", bad, expect_rc=1)
    check("magic" in r.stderr, f"fashion: bad magic message {r.stderr!r}")
    # Without the IDX files (a GPU node given the shards): complete shards of
    # Fashion-MNIST's sizes are left alone, others are an error naming the file.
    nowhere = os.path.join(tmp, "no_idx")
    r = run("prepare_fashion_mnist", out, "--source", nowhere, "--shards", "3", expect_rc=1)
    check("train-labels-idx1-ubyte.gz" in r.stderr, f"fashion: no source, 50 images: {r.stderr!r}")
    full = os.path.join(tmp, "fm_full")
    os.makedirs(full)
    for name, n in [("train_000.h5", 30000), ("train_001.h5", 30000), ("test_000.h5", 10000)]:
        with h5py.File(os.path.join(full, name), "w") as f:
            f.create_dataset("x", data=np.zeros((n, 1, 28, 28), np.uint8))
            f.create_dataset("y", data=np.zeros(n, np.int64))
            f.attrs["format"] = "ddp_train.shard"
            f.attrs["version"] = np.int64(1)
    r = run("prepare_fashion_mnist", full, "--source", nowhere, "--shards", "2")
    check("already complete" in r.stdout, f"fashion: no source, complete shards: {r.stdout!r}")


with tempfile.TemporaryDirectory() as tmp:
    test_regression(tmp)
    test_fashion(tmp)
print("all checks passed" if not FAILURES else f"{len(FAILURES)} check(s) failed")
sys.exit(1 if FAILURES else 0)
