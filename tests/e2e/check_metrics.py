#!/usr/bin/env python3
"""Checks a run's metrics.jsonl.

usage: check_metrics.py RUN_DIR --epochs N --world-size W [--min-val-acc A] [--max-val-loss L]
"""
import argparse
import json
import math
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--min-val-acc", type=float)
    p.add_argument("--max-val-loss", type=float)
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
    print(json.dumps(last))
    if errors:
        print("FAIL: " + "; ".join(errors))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
