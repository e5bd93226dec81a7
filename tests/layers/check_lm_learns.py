#!/usr/bin/env python3
"""A language model's run learned its synthetic source: the last epoch's val_loss is
within MARGIN (relative) of the entropy rate the shards' attribute entropy_rate holds
(tools/make_markov_tokens), and its validation record is a language model's: val_ppl =
exp(val_loss), val_tokens = val_count * SEQ_LEN, val_correct <= val_tokens.

usage: check_lm_learns.py RUN_DIR SHARD SEQ_LEN MARGIN
"""
import json
import math
import os
import sys

try:
    import h5py
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("check_lm_learns.py: needs h5py")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


run_dir, shard, seq_len, margin = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with h5py.File(shard, "r") as f:
    h = float(f.attrs["entropy_rate"])
records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"val_loss"' in line]
if not records:
    fail(f"no validation record in {run_dir}/metrics.jsonl")
last = records[-1]
loss = last["val_loss"]
print(f"entropy rate {h:.4f} nats/token; val_loss by epoch: " + ", ".join(f"{r['val_loss']:.4f}" for r in records))
print(f"last val_loss {loss:.4f} = {loss / h:.4f} x the entropy rate (allowed: {1 + margin:.4f})")
if not abs(last["val_ppl"] - math.exp(loss)) <= 1e-9 * math.exp(loss):
    fail(f"val_ppl {last['val_ppl']} is not exp(val_loss) = {math.exp(loss)}")
if last["val_tokens"] != last["val_count"] * seq_len:
    fail(f"val_tokens {last['val_tokens']} != val_count {last['val_count']} x {seq_len}")
if not 0 <= last["val_correct"] <= last["val_tokens"]:
    fail(f"val_correct {last['val_correct']} outside [0, val_tokens]")
if abs(last["val_acc"] - last["val_correct"] / last["val_tokens"]) > 1e-12:
    fail("val_acc is not val_correct / val_tokens")
if loss < h * (1 - 0.02):
    fail(f"val_loss {loss:.4f} below the entropy rate {h:.4f}: the validation loss cannot beat the source")
if loss > h * (1 + margin):
    fail(f"val_loss {loss:.4f} is more than {margin:.0%} above the entropy rate {h:.4f}")
print("PASS")
