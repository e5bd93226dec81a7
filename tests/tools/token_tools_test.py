#!/usr/bin/env python3
"""tools/llmc_to_h5 and tools/text_to_tokens on files made here.

usage: token_tools_test.py TOOLS_DIR WORK_DIR

llmc_to_h5: llm.c GPT-2 (magic 20240520, v1, uint16) and LLaMA 3 (20240801, v7,
uint32) files and a header-less nanoGPT one: the shards hold the very tokens, in
order across --shard-tokens pieces of equal length, with vocab_size and source;
a truncated file, a wrong magic or version, a token above the vocabulary and
--raw without --vocab are each one line naming the file (and the offset).
text_to_tokens: the shards decode, through the vocabulary they carry, to the
files' bytes with <|endoftext|> after each; the split is the stream's last tenth.
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

tools, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, tools)
from checks import check, finish  # noqa: E402
from token_shards import read_vocab  # noqa: E402


def run(tool, *args):
    p = subprocess.run([os.path.join(tools, tool), *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def llmc_file(path, tokens, magic=20240520, version=1, count=None, dtype=np.uint16):
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())


def tokens_of(paths):
    out = []
    for p in paths:
        with h5py.File(p, "r") as f:
            out.append(f["tokens"][...])
    return np.concatenate(out)


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
rng = np.random.default_rng(0)

# GPT-2 tokens, split into 4 shards of equal length (10001 = 2500 + 2500 + 2500 + 2501).
gpt2 = rng.integers(0, 50257, 10001)
gpt2[:3] = [0, 50256, 65535 % 50257]
llmc_file(f"{work}/fineweb_val_000000.bin", gpt2)
rc, out = run("llmc_to_h5", f"{work}/fineweb_val_000000.bin", f"{work}/h5", "--shard-tokens", "3000")
check(rc == 0, f"GPT-2 file converts ({out.strip()})")
shards = [f"{work}/h5/fineweb_val_000000_{i:03d}.h5" for i in range(4)]
check(all(os.path.exists(p) for p in shards), "4 shards named after the file")
check(np.array_equal(tokens_of(shards), gpt2), "the shards hold the file's tokens in order")
with h5py.File(shards[0], "r") as f:
    check(f["tokens"].dtype == np.uint16 and f.attrs["vocab_size"] == 50257 and
          f.attrs["format"] == "ddp_train.tokens" and f.attrs["source"] == "fineweb_val_000000.bin",
          "uint16, vocab_size 50257, format and source")
check(sorted(len(tokens_of([p])) for p in shards) == [2500, 2500, 2500, 2501], "equal lengths")

# LLaMA 3's uint32 tokens, one shard.
llama = rng.integers(0, 128256, 777)
llama[0] = 128255
llmc_file(f"{work}/llama.bin", llama, magic=20240801, version=7, dtype=np.uint32)
rc, out = run("llmc_to_h5", f"{work}/llama.bin", f"{work}/h5")
with h5py.File(f"{work}/h5/llama.h5", "r") as f:
    check(rc == 0 and f["tokens"].dtype == np.uint32 and f.attrs["vocab_size"] == 128256 and
          np.array_equal(f["tokens"][...], llama), "LLaMA 3 file: uint32, vocabulary 128256, its tokens")

# nanoGPT: no header.
raw = rng.integers(0, 50257, 5000).astype(np.uint16)
raw.tofile(f"{work}/train.bin")
rc, out = run("llmc_to_h5", f"{work}/train.bin", f"{work}/h5", "--raw", "uint16", "--vocab", "50304")
with h5py.File(f"{work}/h5/train.h5", "r") as f:
    check(rc == 0 and f.attrs["vocab_size"] == 50304 and np.array_equal(f["tokens"][...], raw),
          "nanoGPT's header-less file with --raw uint16 --vocab 50304")


def refused(args, regex_parts, what):
    rc, out = run("llmc_to_h5", *args)
    lines = out.strip().splitlines()
    ok = rc != 0 and len(lines) == 1 and all(p in lines[0] for p in regex_parts)
    check(ok, f"{what}: {out.strip()}")


llmc_file(f"{work}/short.bin", gpt2[:50], count=10001)
refused([f"{work}/short.bin", f"{work}/x"], ["short.bin: the header says 10001 tokens", "but 100 bytes follow"],
        "truncated")
refused([f"{work}/train.bin", f"{work}/x"], ["train.bin: magic", "give --raw uint16"], "no header")
llmc_file(f"{work}/v2.bin", gpt2, version=2)
refused([f"{work}/v2.bin", f"{work}/x"], ["v2.bin: magic 20240520", "version 2: only version 1"], "version")
big = gpt2.copy()
big[4321] = 50300
llmc_file(f"{work}/big.bin", big)
refused([f"{work}/big.bin", f"{work}/x"], ["big.bin: token 50300 at offset 4321 is outside the vocabulary [0, 50257)"],
        "token above the vocabulary")
rc, out = run("llmc_to_h5", f"{work}/train.bin", f"{work}/x", "--raw", "uint16")
check(rc != 0 and "--raw needs --vocab" in out, "--raw without --vocab")
check(not os.path.exists(f"{work}/x/big.h5") and not os.path.exists(f"{work}/x/short.h5"),
      "nothing written for a refused file")

# text_to_tokens: two files, decoded back through the shards' vocabulary.
texts = ["Grüße aus dem Rechenzentrum.\n" * 40, "srun ./ddp_train input.nml\n" * 60]
for i, t in enumerate(texts):
    with open(f"{work}/doc{i}.txt", "w", encoding="utf-8") as f:
        f.write(t)
rc, out = run("text_to_tokens", f"{work}/doc0.txt", f"{work}/doc1.txt", f"{work}/text", "--shard-tokens", "1000")
check(rc == 0, f"text_to_tokens runs ({out.strip()})")
train = sorted(p for p in os.listdir(f"{work}/text") if p.startswith("train_"))
val = sorted(p for p in os.listdir(f"{work}/text") if p.startswith("val_"))
stream = np.concatenate([tokens_of([f"{work}/text/{p}"]) for p in train + val])
with h5py.File(f"{work}/text/{train[0]}", "r") as f:
    vocab = read_vocab(f)
    check(f.attrs["vocab_size"] == 257 and f.attrs["eot_token"] == 256 and f.attrs["tokenizer"] == "bytes",
          "vocab_size 257, eot_token 256, tokenizer bytes")
expected = b"".join(t.encode("utf-8") + b"<|endoftext|>" for t in texts)
check(b"".join(vocab[int(v)] for v in stream) == expected, "the shards decode to the files, <|endoftext|> after each")
n_val = len(tokens_of([f"{work}/text/{p}" for p in val]))
check(n_val == int(len(stream) * 0.1) and len(train) == 3, f"validation the last tenth ({n_val} of {len(stream)})")

finish("token_tools_test")
