#!/usr/bin/env python3
"""tools/plot_metrics on two real runs: the PNG is a real plot, and two runs overlay.

usage: plot_metrics_check.py PLOT_METRICS DDP_TRAIN INPUT.nml MPIEXEC [FLAGS ...] -n

Trains two short 2-rank runs (other learning rates, so other curves), renders the
first alone and both together, then checks each PNG: its size and dimensions, that
it is not blank (ink and many colours), that the first run's colour (matplotlib's
C0) is drawn in both, and that the second run's (C1) appears only in the overlay.
Also: a run directory without metrics.jsonl is one error line and exit status 2, and
the top axis maps steps to epochs through the epoch ends, straight on past the last.
The first run keeps the best val_loss (io.keep_best): its best epoch is starred and
named in the tool's line, and the second run's (without keep_best) is not.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import numpy as np  # noqa: E402

plot, ddp_train, nml = sys.argv[1:4]
launch = sys.argv[4:]  # the launcher up to its process-count flag
C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's first two cycle colours
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def train(run_dir, lr, *more):
    shutil.rmtree(run_dir, ignore_errors=True)
    r = run(launch + ["2", ddp_train, nml, "train.epochs=3", f"train.lr={lr}",
             f"io.run_dir={run_dir}", "train.log_every=0", *more])
    if r.returncode != 0:
        sys.exit(f"FAIL: training {run_dir}: exit {r.returncode}\n{r.stdout}{r.stderr}")


def pixels_near(img, rgb, tol=0.03):
    """How many pixels are within tol (per channel, 0..1) of rgb."""
    target = np.array(rgb) / 255.0
    return int(np.all(np.abs(img[:, :, :3] - target) <= tol, axis=2).sum())


def inspect(path, runs):
    check(os.path.isfile(path), f"{path} written")
    if not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    check(20_000 < size < 2_000_000, f"{path}: {size} bytes, a plot's size")
    with open(path, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path}: PNG signature")
    img = mpimg.imread(path)  # (H, W, 3 or 4) floats in 0..1
    h, w = img.shape[:2]
    check(800 <= w <= 2400 and 600 <= h <= 1800, f"{path}: {w}x{h} pixels")
    rgb = (img[:, :, :3] * 255).round().astype(np.uint8)
    ink = float(np.any(rgb < 245, axis=2).mean())
    colours = len(np.unique(rgb.reshape(-1, 3), axis=0))
    check(ink > 0.03, f"{path}: {ink:.1%} of the pixels are not background (> 3%)")
    check(colours > 50, f"{path}: {colours} distinct colours (> 50)")
    c0, c1 = pixels_near(img, C0), pixels_near(img, C1)
    check(c0 > 1000, f"{path}: {c0} pixels in the first run's colour (> 1000: its lines are drawn)")
    if runs == 1:
        check(c1 < 50, f"{path}: {c1} pixels in the second run's colour (< 50: one run only)")
    else:
        check(c1 > 1000, f"{path}: {c1} pixels in the second run's colour (> 1000: the runs overlay)")
    return rgb


train("runs/plot_a", 0.5, "io.keep_best=val_loss")
train("runs/plot_b", 0.02)
records_a = [json.loads(line) for line in open("runs/plot_a/metrics.jsonl")]
best_a = min(records_a, key=lambda r: r["val_loss"])  # the first of a tie
check(best_a is not records_a[-1], f"runs/plot_a's best val_loss is at epoch {best_a['epoch']} of 3, not the last "
      "(else this proves little)")
starred = f"best val_loss {best_a['val_loss']:.4f} at epoch {best_a['epoch']} of runs/plot_a starred"

r = run([plot, "runs/plot_a", "-o", "plot_one.png"])
print(r.stdout + r.stderr)
check(r.returncode == 0, "plot_metrics on one run exits 0")
check(starred in r.stdout, f"its line says: {starred}")
one = inspect("plot_one.png", 1)

r = run([plot, "runs/plot_a", "runs/plot_b", "-o", "plot_two.png"])
print(r.stdout + r.stderr)
check(r.returncode == 0, "plot_metrics on two runs exits 0")
check(re.search(r"\(2 runs, ", r.stdout) is not None, "plot_metrics reports 2 runs")
check(r.stdout.count(" starred") == 1 and starred in r.stdout, "the first run's best is starred, not the second's")
two = inspect("plot_two.png", 2)
if one is not None and two is not None:
    check(one.shape != two.shape or bool(np.any(one != two)), "the overlay differs from the one-run plot")

# A directory that holds no run: one line naming metrics.jsonl, exit 2.
os.makedirs("runs/plot_empty", exist_ok=True)
r = run([plot, "runs/plot_empty", "-o", "plot_empty.png"])
lines = r.stderr.strip().splitlines()
print(r.stderr)
check(r.returncode == 2, f"no metrics.jsonl: exit status {r.returncode} (2)")
check(len(lines) == 1 and "runs/plot_empty/metrics.jsonl: no such file" in lines[0],
      "no metrics.jsonl: one error line naming the file")
check(not os.path.exists("plot_empty.png"), "no metrics.jsonl: no PNG written")

# The top axis: step -> epoch through the epoch ends, and straight on past the last one
# into the axes' margin (a clamped map put epoch 3 at the right edge, not over its point).
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402

loader = importlib.machinery.SourceFileLoader("plot_metrics", plot)
tool = importlib.util.module_from_spec(importlib.util.spec_from_loader("plot_metrics", loader))
loader.exec_module(tool)
steps, epochs = [0, 469, 938, 1407], [0, 1, 2, 3]
got = tool.extrapolated([469, 703.5, 938, 1407, 1500, -46.9], steps, epochs)
check(bool(np.allclose(got, [1, 1.5, 2, 3, 3 + 93 / 469, -0.1])), f"step -> epoch {list(got)}")
check(tool.best_point(records_a) == ("val_loss", best_a["step"], best_a["val_loss"], best_a["epoch"]),
      f"best_point of runs/plot_a: {tool.best_point(records_a)}")
check(tool.best_point([json.loads(line) for line in open("runs/plot_b/metrics.jsonl")]) is None,
      "best_point of a run without io.keep_best: None")
back = tool.extrapolated(got, epochs, steps)
check(bool(np.allclose(back, [469, 703.5, 938, 1407, 1500, -46.9])), "epoch -> step inverts it")

if failures:
    sys.exit(f"FAIL: {len(failures)} check(s)")
print("PASS")
