#!/usr/bin/env python3
"""tools/text_to_tokens --bpe and --tokenizer (a byte-level BPE, Hugging Face's
tokenizers) on this project's manual.

usage: bpe_tokens_test.py TOOLS_DIR DOCS_DIR WORK_DIR

--bpe 512 on two files, the first over the tool's 1 MiB piece (the manual five
times over): the shards decode, through the vocabulary they carry, to the files'
bytes with <|endoftext|> after each; each file's tokens are the ones the
tokenizer stored in the shards (/tokenizer_json) gives for the whole file in one
piece (the cutting into pieces changes no token), the manual's own "<|endoftext|>"
encoded as text; fewer tokens than bytes; the
same files twice give byte-identical shards. --tokenizer with that tokenizer.json
encodes a third file as the library does. Refusals, one line each: a file that is
not UTF-8 (its byte named), --bpe below 257, a tokenizer that is not byte-level,
an end-of-text token the tokenizer lacks, a file that is no tokenizer.
Exits 77 (skipped) without the tokenizers package.
"""
import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys

try:
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError:
    print("bpe_tokens_test: skipped: no tokenizers package (tools/install_deps --test installs it)")
    sys.exit(77)
import h5py
import numpy as np

tools, docs, work = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tools)
from checks import check, finish  # noqa: E402
from token_shards import read_vocab  # noqa: E402


def run(*args):
    p = subprocess.run([sys.executable, os.path.join(tools, "text_to_tokens"), *args], capture_output=True,
                       text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


def refused(args, parts, what):
    rc, out = run(*args)
    check(rc != 0 and len(out.splitlines()) == 1 and all(p in out for p in parts), f"{what}: {out}")


def shards(d):
    return sorted(glob.glob(f"{d}/train_*.h5")) + sorted(glob.glob(f"{d}/val_*.h5"))


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
manual = b"".join(open(p, "rb").read() for p in sorted(glob.glob(f"{docs}/*.md")))
files = {f"{work}/manual5.md": manual * 5, f"{work}/greeting.txt": "Grüße aus dem Rechenzentrum: ÷ ∑ 🙂\n".encode() * 50}
for path, data in files.items():
    open(path, "wb").write(data)
check(len(manual) * 5 > (1 << 20), f"the first file ({len(manual) * 5} bytes) is over the 1 MiB piece")

rc, out = run(*files, f"{work}/bpe", "--bpe", "512", "--shard-tokens", "200000")
check(rc == 0, f"--bpe 512 runs ({out})")
paths = shards(f"{work}/bpe")
stream = np.concatenate([h5py.File(p, "r")["tokens"][...] for p in paths]).astype(np.int64)
with h5py.File(paths[0], "r") as f:
    vocab = read_vocab(f)
    eot = int(f.attrs["eot_token"])
    check(f.attrs["tokenizer"] == "bpe" and f.attrs["vocab_size"] == 512 and len(vocab) == 512 and
          f["tokens"].dtype == np.uint16, "tokenizer bpe, vocab_size 512, its table, uint16 tokens")
    tok = Tokenizer.from_str(bytes(f["tokenizer_json"][...]).decode())
check(vocab[eot] == b"<|endoftext|>" and tok.token_to_id("<|endoftext|>") == eot, f"eot_token {eot} <|endoftext|>")
check(b"".join(vocab[v] for v in stream) == b"".join(d + b"<|endoftext|>" for d in files.values()),
      "the shards decode to the files' bytes, <|endoftext|> after each")
ends = np.flatnonzero(stream == eot)
first = stream[:ends[0]]
# The manual writes "<|endoftext|>": text, not a document's end (the tokenizer less its
# added tokens encodes it, as tiktoken's encode_ordinary).
ordinary = Tokenizer.from_str(json.dumps({**json.loads(tok.to_str()), "added_tokens": []}))
whole = ordinary.encode(manual.decode() * 5, add_special_tokens=False).ids
check(b"<|endoftext|>" in manual and len(ends) == 2, f"<|endoftext|> only at the files' ends ({len(ends)})")
check(np.array_equal(first, whole),
      f"the long file's {len(first)} tokens are the tokenizer's for it in one piece ({len(whole)})")
check(len(stream) * 1.5 < sum(len(d) for d in files.values()), f"{len(stream)} tokens for "
      f"{sum(len(d) for d in files.values())} bytes (more than 1.5 bytes a token)")
rc, _ = run(*files, f"{work}/bpe2", "--bpe", "512", "--shard-tokens", "200000")
check(rc == 0 and [os.path.basename(p) for p in shards(f"{work}/bpe2")] == [os.path.basename(p) for p in paths] and
      all(filecmp.cmp(p, f"{work}/bpe2/{os.path.basename(p)}", shallow=False) for p in paths),
      f"the same files twice: byte-identical shards ({len(paths)})")

# --tokenizer: the one just trained, saved as a tokenizer.json, on another file.
tok.save(f"{work}/tokenizer.json")
open(f"{work}/third.txt", "w", encoding="utf-8").write("srun ./ddp_train input.nml\n" * 80)
rc, out = run(f"{work}/third.txt", f"{work}/third", "--tokenizer", f"{work}/tokenizer.json", "--val-fraction", "0")
got = np.concatenate([h5py.File(p, "r")["tokens"][...] for p in shards(f"{work}/third")]).astype(np.int64)
want = ordinary.encode("srun ./ddp_train input.nml\n" * 80, add_special_tokens=False).ids + [eot]
check(rc == 0 and np.array_equal(got, want), f"--tokenizer encodes as the library does ({out})")

open(f"{work}/latin1.txt", "wb").write("caf\u00e9 au lait\n".encode("latin-1"))
refused([f"{work}/latin1.txt", f"{work}/x", "--bpe", "300"], ["latin1.txt: not UTF-8 text (byte 3: 0xe9)"],
        "not UTF-8")
refused([f"{work}/third.txt", f"{work}/x", "--bpe", "100"], ["--bpe 100", "at least 257"], "--bpe below 257")
word = Tokenizer(models.WordLevel({"[UNK]": 0, "srun": 1}, unk_token="[UNK]"))
word.pre_tokenizer = pre_tokenizers.Whitespace()
word.save(f"{work}/wordlevel.json")
refused([f"{work}/third.txt", f"{work}/x", "--tokenizer", f"{work}/wordlevel.json"],
        ["wordlevel.json: not a byte-level tokenizer (its decoder is None)"], "not byte-level")
refused([f"{work}/third.txt", f"{work}/x", "--tokenizer", f"{work}/tokenizer.json", "--eot", "<|end_of_text|>"],
        ["no token <|end_of_text|> in its vocabulary"], "no such end-of-text token")
refused([f"{work}/third.txt", f"{work}/x", "--tokenizer", f"{work}/third.txt"],
        ["third.txt: not a tokenizer.json that Hugging Face's tokenizers reads"], "not a tokenizer")
check(not os.path.exists(f"{work}/x"), "nothing written for a refused run")

finish("bpe_tokens_test")
