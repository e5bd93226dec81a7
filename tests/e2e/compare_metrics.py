#!/usr/bin/env python3
"""Asserts that two runs' metrics.jsonl agree exactly on the given keys.

usage: compare_metrics.py RUN_DIR_A RUN_DIR_B KEY [KEY ...]
"""
import json
import sys


def load(run_dir):
    with open(run_dir + "/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


a, b = load(sys.argv[1]), load(sys.argv[2])
keys = sys.argv[3:]
if len(a) != len(b) or not a:
    sys.exit(f"FAIL: {len(a)} and {len(b)} records")
for i, (ra, rb) in enumerate(zip(a, b)):
    for k in keys:
        print(f"epoch {i + 1} {k}: {ra.get(k)!r} {rb.get(k)!r}")
        if k not in ra or ra.get(k) != rb.get(k):
            sys.exit(f"FAIL: epoch {i + 1} {k} differs")
print("PASS")
