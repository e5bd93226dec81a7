#!/usr/bin/env python3
"""A language model's run learned its synthetic source: the last epoch's val_loss is
within MARGIN (relative) of the entropy rate the shards' attribute entropy_rate holds
(tools/make_markov_tokens), and its validation record is a language model's: val_ppl =
exp(val_loss), val_tokens = val_count * SEQ_LEN, val_correct <= val_tokens.
With --unigram (real text, whose entropy rate nobody knows): the val_loss is at least
MARGIN (relative) below the entropy of the shard's tokens taken one at a time (their
unigram frequencies): the model predicts from context, not from frequencies alone.

--samples N: RUN_DIR/samples.txt (io.sample_tokens = N) holds one record a validation,
each the prompt and N decoded tokens (byte-level shards: N bytes, an <|endoftext|> 13).

usage: check_lm_learns.py RUN_DIR SHARD SEQ_LEN MARGIN [--unigram] [--samples N]
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
unigram = "--unigram" in sys.argv[5:]
with h5py.File(shard, "r") as f:
    if unigram:
        import numpy as np
        counts = np.bincount(f["tokens"][...].astype(np.int64))
        p = counts[counts > 0] / counts.sum()
        h = float(-(p * np.log(p)).sum())
    else:
        h = float(f.attrs["entropy_rate"])
records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"val_loss"' in line]
if not records:
    fail(f"no validation record in {run_dir}/metrics.jsonl")
last = records[-1]
loss = last["val_loss"]
what = "unigram entropy" if unigram else "entropy rate"
print(f"{what} {h:.4f} nats/token; val_loss by epoch: " + ", ".join(f"{r['val_loss']:.4f}" for r in records))
print(f"last val_loss {loss:.4f} = {loss / h:.4f} x the {what} (allowed: "
      f"{'at most ' + format(1 - margin, '.4f') if unigram else format(1 + margin, '.4f')})")
if not abs(last["val_ppl"] - math.exp(loss)) <= 1e-9 * math.exp(loss):
    fail(f"val_ppl {last['val_ppl']} is not exp(val_loss) = {math.exp(loss)}")
if last["val_tokens"] != last["val_count"] * seq_len:
    fail(f"val_tokens {last['val_tokens']} != val_count {last['val_count']} x {seq_len}")
if not 0 <= last["val_correct"] <= last["val_tokens"]:
    fail(f"val_correct {last['val_correct']} outside [0, val_tokens]")
if abs(last["val_acc"] - last["val_correct"] / last["val_tokens"]) > 1e-12:
    fail("val_acc is not val_correct / val_tokens")
if "--samples" in sys.argv:
    n = int(sys.argv[sys.argv.index("--samples") + 1])
    text = open(os.path.join(run_dir, "samples.txt"), "rb").read()
    heads = [l for l in text.split(b"\n") if l.startswith(b"== epoch ")]
    print(f"samples.txt: {len(heads)} records; the last:\n{text.decode('utf-8', 'replace').split('== epoch')[-1]}")
    if len(heads) != len(records):
        fail(f"samples.txt has {len(heads)} records for {len(records)} validations")
    body = text.split(b"== epoch ")[-1].split(b"\n", 1)[1]
    written = body[body.index(b" >>> ") + 5:].rstrip(b"\n")
    if not n <= len(written) <= 13 * n:
        fail(f"the last record wrote {len(written)} bytes for {n} tokens")
if unigram:
    if loss > h * (1 - margin):
        fail(f"val_loss {loss:.4f} is not {margin:.0%} below the unigram entropy {h:.4f}")
    print("PASS")
    sys.exit(0)
if loss < h * (1 - 0.02):
    fail(f"val_loss {loss:.4f} below the entropy rate {h:.4f}: the validation loss cannot beat the source")
if loss > h * (1 + margin):
    fail(f"val_loss {loss:.4f} is more than {margin:.0%} above the entropy rate {h:.4f}")
print("PASS")
