#!/usr/bin/env python3
"""Token shards that went through llm.c's file format and back.

usage: make_llmc_shards.py SRC_DIR OUT_DIR LLMC_TO_H5

Every SRC_DIR/*.h5 token shard is written as an llm.c GPT-2 file (256 int32 of
header: magic 20240520, version 1, the count; then uint16 tokens) OUT_DIR/bin/<name>.bin,
and tools/llmc_to_h5 turns those into OUT_DIR/<name>.h5 with the source's vocabulary:
the same tokens under other files (checked here, token for token).
"""
import glob
import os
import subprocess
import sys

import h5py
import numpy as np

src, out, tool = sys.argv[1:4]
os.makedirs(os.path.join(out, "bin"), exist_ok=True)
bins, vocab = [], None
for path in sorted(glob.glob(os.path.join(src, "*.h5"))):
    with h5py.File(path, "r") as f:
        tokens = f["tokens"][...].astype(np.uint16)
        vocab = int(f.attrs["vocab_size"])
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    b = os.path.join(out, "bin", os.path.basename(path)[:-3] + ".bin")
    with open(b, "wb") as f:
        f.write(header.tobytes() + tokens.astype("<u2").tobytes())
    bins.append(b)
rc = subprocess.call([tool, *bins, out, "--vocab", str(vocab)])
if rc != 0:
    sys.exit(rc)
for path in sorted(glob.glob(os.path.join(src, "*.h5"))):
    with h5py.File(path, "r") as a, h5py.File(os.path.join(out, os.path.basename(path)), "r") as b:
        same = np.array_equal(a["tokens"][...], b["tokens"][...]) and a.attrs["vocab_size"] == b.attrs["vocab_size"]
    print(f"{path}: the tokens back from llm.c's format {'equal' if same else 'DIFFER from'} the original's")
    if not same:
        sys.exit(1)
