#!/usr/bin/env python3
"""tools/make_synthetic_images: format, determinism, balance, and labels learnable from pixels.

usage: make_synthetic_images_test.py PATH/TO/tools/make_synthetic_images

Learnability: a nearest-class-mean classifier (class means of the training
images' raw pixels, Euclidean distance) must score above 0.9 on the validation
split with 10 classes at 32x32 and the default noise (chance: 0.1), and still
well above chance (> 0.5) at 3x the default noise.
"""
import filecmp
import glob
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run(tool, out, *args):
    p = subprocess.run([sys.executable, tool, out, *args], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"{' '.join(args)}: exit status {p.returncode}\n{p.stderr}")
    return p


def read(out, split):
    paths = sorted(glob.glob(os.path.join(out, f"{split}_*.h5")))
    xs, ys, meta = [], [], []
    for p in paths:
        with h5py.File(p, "r") as f:
            xs.append(f["x"][...])
            ys.append(f["y"][...])
            names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["class_names"]]
            meta.append((os.path.basename(p), len(f["y"]), f["x"].attrs.get("layout"), f.attrs.get("format"),
                         f.attrs.get("version"), names, f["x"].dtype, f["y"].dtype))
    return np.concatenate(xs), np.concatenate(ys), meta


def nearest_class_mean(xt, yt, xv, yv, classes):
    xt = xt.reshape(len(xt), -1).astype(np.float64)
    xv = xv.reshape(len(xv), -1).astype(np.float64)
    means = np.stack([xt[yt == c].mean(axis=0) for c in range(classes)])  # (C, D)
    # |x - m|^2 = |x|^2 - 2 x.m + |m|^2; |x|^2 is the same for every class
    scores = xv @ means.T - 0.5 * (means ** 2).sum(axis=1)[None, :]
    return float((scores.argmax(axis=1) == yv).mean())


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c, d = (os.path.join(tmp, n) for n in "abcd")
        small = ["--side", "32", "--classes", "10", "--train", "3000", "--val", "1000", "--seed", "7"]
        run(tool, a, *small, "--shard-size", "1024")
        run(tool, b, *small, "--shard-size", "1024")
        run(tool, c, *small, "--shard-size", "700")
        run(tool, d, *small[:-1], "8", "--shard-size", "1024")

        xt, yt, meta = read(a, "train")
        xv, yv, vmeta = read(a, "val")
        check([m[:2] for m in meta] == [("train_000.h5", 1024), ("train_001.h5", 1024), ("train_002.h5", 952)],
              f"train shards {[m[:2] for m in meta]}")
        check([m[:2] for m in vmeta] == [("val_000.h5", 1000)], f"val shards {[m[:2] for m in vmeta]}")
        names = [f"class_{i:03d}" for i in range(10)]
        for m in meta + vmeta:
            check(m[2:] == ("NHWC", "ddp_train.shard", 1, names, np.uint8, np.int64), f"{m[0]}: {m[2:]}")
        check(xt.shape == (3000, 32, 32, 3) and xv.shape == (1000, 32, 32, 3), f"shapes {xt.shape} {xv.shape}")

        # determinism: same arguments, same bytes; another shard size, the same images; another seed, others
        for name in sorted(os.listdir(a)):
            check(filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False),
                  f"{name}: two runs with the same seed differ")
        xc, yc, _ = read(c, "train")
        check(np.array_equal(xc, xt) and np.array_equal(yc, yt), "--shard-size 700 changes the images")
        xd, yd, _ = read(d, "train")
        check(not np.array_equal(xd, xt) and not np.array_equal(yd, yt), "--seed 8 gives the images of --seed 7")

        # labels: in range, balanced, not in plain i % classes order
        for split, y, n in (("train", yt, 3000), ("val", yv, 1000)):
            check(y.min() >= 0 and y.max() < 10, f"{split}: labels outside 0..9")
            check(np.bincount(y, minlength=10).tolist() == [n // 10] * 10, f"{split}: counts {np.bincount(y)}")
            check(not np.array_equal(y, np.arange(n) % 10), f"{split}: labels not permuted")
        check(xt.std() > 20, f"train pixels nearly constant (std {xt.std():.1f})")

        acc = nearest_class_mean(xt, yt, xv, yv, 10)
        print(f"nearest class mean, 10 classes, 32x32, noise 32: val accuracy {acc:.3f} (threshold 0.9, chance 0.1)")
        check(acc > 0.9, f"nearest class mean scores {acc:.3f} <= 0.9")
        e = os.path.join(tmp, "e")
        run(tool, e, *small, "--noise", "96")
        xe, ye, _ = read(e, "train")
        xf, yf, _ = read(e, "val")
        acc = nearest_class_mean(xe, ye, xf, yf, 10)
        print(f"nearest class mean, noise 96: val accuracy {acc:.3f} (threshold 0.5)")
        check(acc > 0.5, f"noise 96: nearest class mean scores {acc:.3f} <= 0.5")

        # the defaults: ImageNet's shape and 1000 class names
        f = os.path.join(tmp, "f")
        p = run(tool, f, "--train", "300", "--val", "0")
        check(not glob.glob(os.path.join(f, "val_*")), "--val 0 wrote a val shard")
        with h5py.File(os.path.join(f, "train_000.h5"), "r") as h:
            check(h["x"].shape == (300, 224, 224, 3), f"default shape {h['x'].shape}")
            names = list(h.attrs["class_names"])
            check(len(names) == 1000 and names[0] in ("class_000", b"class_000") and names[-1] in ("class_999", b"class_999"),
                  f"default class_names {names[:2]} .. {names[-1:]}")
            check(h["y"][...].max() < 1000, "default labels outside 0..999")
        print(p.stderr.strip())
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
