#!/usr/bin/env python3
"""Checks a run's metrics.jsonl.

usage: check_metrics.py RUN_DIR --epochs N --world-size W [--min-val-acc A] [--max-val-loss L]
                       [--loss-scale-init S --min-skipped K] [--progress]

--progress: the run's output (RUN_DIR.log, as train_and_check.sh writes it) has
progress lines in every epoch whose losses (rank 0's, over the last samples) are
positive and finite, and average, weighted by their samples, to within a factor 2 of
the epoch's train_loss (over every rank's samples).

--loss-scale-init: an fp16 run whose scale never grows (a growth interval longer
than the run): every record must carry loss_scale and skipped_steps, with at least
K steps skipped in all and the final scale exactly S / 2^(steps skipped).
"""
import argparse
import json
import math
import re
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--min-val-acc", type=float)
    p.add_argument("--max-val-loss", type=float)
    p.add_argument("--loss-scale-init", type=float)
    p.add_argument("--min-skipped", type=int, default=1)
    p.add_argument("--progress", action="store_true")
    a = p.parse_args()
    with open(a.run_dir + "/metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    errors = []
    if len(records) != a.epochs:
        errors.append(f"{len(records)} records, expected {a.epochs}")
    for i, r in enumerate(records):
        for key in ("epoch", "step", "train_loss", "samples_per_s", "world_size"):
            if key not in r:
                errors.append(f"record {i}: no '{key}'")
        if r.get("epoch") != i + 1:
            errors.append(f"record {i}: epoch {r.get('epoch')}")
        if r.get("world_size") != a.world_size:
            errors.append(f"record {i}: world_size {r.get('world_size')}")
        if not (r.get("samples_per_s", 0) > 0 and math.isfinite(r.get("train_loss", math.nan))):
            errors.append(f"record {i}: bad samples_per_s or train_loss")
    last = records[-1] if records else {}
    if a.min_val_acc is not None and not last.get("val_acc", -1) >= a.min_val_acc:
        errors.append(f"final val_acc {last.get('val_acc')} < {a.min_val_acc}")
    if a.max_val_loss is not None and not last.get("val_loss", math.inf) <= a.max_val_loss:
        errors.append(f"final val_loss {last.get('val_loss')} > {a.max_val_loss}")
    if a.loss_scale_init is not None:
        skipped = sum(r.get("skipped_steps", 0) for r in records)
        if not all("loss_scale" in r and "skipped_steps" in r for r in records):
            errors.append("records without loss_scale / skipped_steps")
        elif skipped < a.min_skipped:
            errors.append(f"{skipped} steps skipped, expected at least {a.min_skipped}")
        elif last["loss_scale"] != a.loss_scale_init * 0.5 ** skipped:
            errors.append(f"final loss_scale {last['loss_scale']} != {a.loss_scale_init} / 2^{skipped}")
        print(f"fp16: {skipped} steps skipped, loss scale {a.loss_scale_init:g} -> {last.get('loss_scale')}")
    if a.progress:
        errors += progress_errors(a.run_dir + ".log", records)
    print(json.dumps(last))
    if errors:
        print("FAIL: " + "; ".join(errors))
        sys.exit(1)
    print("PASS")


def progress_errors(log, records):
    line = re.compile(r"^  epoch (\d+)  step \d+  loss (\S+) \(rank 0, last (\d+) samples\)")
    sums = {}  # epoch -> (loss * samples, samples)
    errors = []
    for text in open(log):
        m = line.match(text)
        if not m:
            continue
        epoch, loss, n = int(m.group(1)), float(m.group(2)), int(m.group(3))
        if not (math.isfinite(loss) and loss > 0):
            errors.append(f"progress line with loss {m.group(2)}: {text.strip()}")
        s, c = sums.get(epoch, (0.0, 0))
        sums[epoch] = (s + loss * n, c + n)
    for r in records:
        s, c = sums.get(r["epoch"], (0.0, 0))
        if c == 0:
            errors.append(f"epoch {r['epoch']}: no progress line")
        elif not 0.5 <= (s / c) / r["train_loss"] <= 2:
            errors.append(f"epoch {r['epoch']}: progress lines average {s / c:.4f}, train_loss {r['train_loss']:.4f}")
        else:
            print(f"epoch {r['epoch']}: progress lines average {s / c:.4f} (rank 0), train_loss {r['train_loss']:.4f}")
    return errors


if __name__ == "__main__":
    main()
