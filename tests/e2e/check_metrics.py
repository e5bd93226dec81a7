#!/usr/bin/env python3
"""Checks a run's metrics.jsonl.

usage: check_metrics.py RUN_DIR --epochs N --world-size W [--min-val-acc A] [--max-val-loss L] [--loss-falls]
                       [--loss-scale-init S --min-skipped K] [--progress [--eta-decreases]]

--progress: the run's output (RUN_DIR.log, as train_and_check.sh writes it) has
progress lines in every epoch whose losses (rank 0's, over the last samples) are
positive and finite, and average, weighted by their samples, to within a factor 2 of
the epoch's train_loss (over every rank's samples). Every progress line carries the
epoch fraction (increasing within an epoch), a positive samples/s and the time left
for the epoch and the run (`eta epoch 4.2s, run 3m12s`), every epoch line the run's
(`eta run 1m02s`, 0.0s on the last). --eta-decreases: the last progress line's run
ETA is below the first's (a run long enough for the ETA's 0.1 s resolution).

--loss-falls: the last epoch's train_loss is below the first's.

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
    p.add_argument("--loss-falls", action="store_true")
    p.add_argument("--loss-scale-init", type=float)
    p.add_argument("--min-skipped", type=int, default=1)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--eta-decreases", action="store_true")
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
    if a.loss_falls and records and not last["train_loss"] < records[0]["train_loss"]:
        errors.append(f"train_loss did not fall: {records[0]['train_loss']} in epoch 1, {last['train_loss']} last")
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
        errors += progress_errors(a.run_dir + ".log", records, a.eta_decreases)
    print(json.dumps(last))
    if errors:
        print("FAIL: " + "; ".join(errors))
        sys.exit(1)
    print("PASS")


# "  epoch 2/10 37%  step 150  loss 0.4123 (rank 0, last 6400 samples)  lr 0.05  samples/s 51234  eta epoch 12s, run 3m12s"
PROGRESS = re.compile(r"^  epoch (\d+)/(\d+) (\d+)%  step (\d+)  loss (\S+) \(rank 0, last (\d+) samples\)  lr \S+  "
                      r"samples/s (\S+)  eta epoch (\S+), run (\S+)$")
# "epoch 3/3  step 1407  train_loss ...  time 0.46 s  eta run 1m02s"
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)  step \d+  train_loss .*  eta run (\S+)$")


def duration(text):
    """Seconds of '4.2s', '42s', '3m12s', '2h05m'; None for anything else ('?')."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d)?)s)?", text)
    if not text or not m:
        return None
    h, mi, s = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)


def progress_lines(text):
    """(parsed progress reports, errors) of a run's output: every line that starts like a
    progress line must carry all its fields."""
    reports, errors = [], []
    for line in text.splitlines():
        if not line.startswith("  epoch "):
            continue
        m = PROGRESS.match(line)
        if not m:
            errors.append(f"progress line without all its fields: {line.strip()}")
            continue
        epoch, epochs, percent, step, loss, n, rate, eta_epoch, eta_run = m.groups()
        r = {"epoch": int(epoch), "epochs": int(epochs), "percent": int(percent), "step": int(step),
             "loss": float(loss), "samples": int(n), "rate": float(rate),
             "eta_epoch": duration(eta_epoch), "eta_run": duration(eta_run), "line": line.strip()}
        if r["eta_epoch"] is None or r["eta_run"] is None:
            errors.append(f"progress line whose ETA does not parse: {line.strip()}")
        elif r["eta_run"] + 0.1 < r["eta_epoch"]:
            errors.append(f"run ETA below the epoch's: {line.strip()}")
        if not (math.isfinite(r["rate"]) and r["rate"] > 0):
            errors.append(f"progress line with samples/s {rate}: {line.strip()}")
        if not (math.isfinite(r["loss"]) and r["loss"] > 0):
            errors.append(f"progress line with loss {loss}: {line.strip()}")
        prev = reports[-1] if reports and reports[-1]["epoch"] == r["epoch"] else None
        if prev and not (r["percent"] >= prev["percent"] and r["step"] > prev["step"]):
            errors.append(f"epoch fraction or step decreases: {prev['line']} -> {line.strip()}")
        reports.append(r)
    # The percentage is whole: over an epoch with several reports it must grow.
    for epoch in sorted({r["epoch"] for r in reports}):
        mine = [r for r in reports if r["epoch"] == epoch]
        if len(mine) > 1 and not mine[-1]["percent"] > mine[0]["percent"]:
            errors.append(f"epoch {epoch}: the fraction does not increase: {mine[0]['line']} ... {mine[-1]['line']}")
    return reports, errors


def epoch_lines(text):
    """(epoch, epochs, run ETA seconds or None) of each epoch line."""
    return [(int(m.group(1)), int(m.group(2)), duration(m.group(3)))
            for m in (EPOCH_LINE.match(line) for line in text.splitlines()) if m]


def progress_errors(log, records, eta_decreases=False):
    text = open(log).read()
    reports, errors = progress_lines(text)
    sums = {}  # epoch -> (loss * samples, samples)
    for r in reports:
        s, c = sums.get(r["epoch"], (0.0, 0))
        sums[r["epoch"]] = (s + r["loss"] * r["samples"], c + r["samples"])
    for r in records:
        s, c = sums.get(r["epoch"], (0.0, 0))
        if c == 0:
            errors.append(f"epoch {r['epoch']}: no progress line")
        elif not 0.5 <= (s / c) / r["train_loss"] <= 2:
            errors.append(f"epoch {r['epoch']}: progress lines average {s / c:.4f}, train_loss {r['train_loss']:.4f}")
        else:
            print(f"epoch {r['epoch']}: progress lines average {s / c:.4f} (rank 0), train_loss {r['train_loss']:.4f}")
    ends = epoch_lines(text)
    if len(ends) != len(records):
        errors.append(f"{len(ends)} epoch lines with a run ETA, {len(records)} records")
    seconds = {r["epoch"]: r.get("train_seconds", 0.0) + r.get("val_seconds", 0.0) for r in records}
    for epoch, epochs, eta in ends:
        # Before the last epoch the run ETA is above 0, unless what is left is under the
        # line's 0.1 s resolution (a tiny epoch takes a few ms: "eta run 0.0s" is right).
        left = seconds.get(epoch, 0.0) * (epochs - epoch)
        if eta is None or (epoch == epochs and eta != 0) or (epoch < epochs and not (eta > 0 or left < 0.1)):
            errors.append(f"epoch {epoch}/{epochs}: run ETA {eta} with about {left:.3f} s left")
    if reports:
        first, last = reports[0], reports[-1]
        print(f"run ETA {first['eta_run']} s at the first report ({first['line']}), "
              f"{last['eta_run']} s at the last ({last['line']})")
        if eta_decreases and not (first["eta_run"] is not None and last["eta_run"] is not None
                                  and last["eta_run"] < first["eta_run"]):
            errors.append(f"the run ETA does not decrease: {first['line']} ... {last['line']}")
    return errors


if __name__ == "__main__":
    main()
