#!/usr/bin/env python3
"""Broken token shards for the language models' error tests, one directory each:

  make_token_shards.py OUT_DIR

  OUT_DIR/bad_id/train_000.h5    vocab_size 16, 2000 tokens; /tokens[1234] = 20
  OUT_DIR/short/train_000.h5     vocab_size 16, 40 tokens: less than a window of 65
  OUT_DIR/novocab/train_000.h5   2000 tokens, no vocab_size attribute
  OUT_DIR/bigvocab/train_000.h5  vocab_size 50257 (GPT-2's), 2000 tokens below 16
  OUT_DIR/both/train_000.h5      /tokens and /x in one file
Every other token is seeded and below 16.
"""
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("make_token_shards.py: needs numpy and h5py")


def write(path, tokens, vocab=None, x=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        f["tokens"] = tokens.astype(np.uint16)
        if vocab is not None:
            f.attrs["vocab_size"] = np.int64(vocab)
        if x:
            f["x"] = np.zeros((len(tokens), 4), np.float32)


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(7)
    t = rng.integers(0, 16, 2000)
    bad = t.copy()
    bad[1234] = 20
    write(os.path.join(out, "bad_id", "train_000.h5"), bad, 16)
    write(os.path.join(out, "short", "train_000.h5"), t[:40], 16)
    write(os.path.join(out, "novocab", "train_000.h5"), t)
    write(os.path.join(out, "bigvocab", "train_000.h5"), t, 50257)
    write(os.path.join(out, "both", "train_000.h5"), t, 16, x=True)


main()
