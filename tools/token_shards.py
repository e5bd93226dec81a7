"""Token shards, the one writer of tools/make_markov_tokens, llmc_to_h5 and
text_to_tokens (docs/data.md, "Token shards").

A shard: /tokens (N) uint16 where the vocabulary fits (<= 65536), else uint32;
root attributes format = "ddp_train.tokens", version = 1, vocab_size, and the
tool's own (source, entropy_rate, ...). Optionally the vocabulary, id to bytes:
/vocab_bytes uint8 (every token's bytes, one after another) and /vocab_offsets
int64 (vocab_size + 1): token v is vocab_bytes[offsets[v]:offsets[v + 1]].
Each file is written under a temporary name and renamed, so a reader never
meets half a shard.
"""
import os

import h5py
import numpy as np

FORMAT, VERSION = "ddp_train.tokens", 1
CHUNK = 1 << 24  # tokens a write


def token_dtype(vocab):
    return np.uint16 if vocab <= 65536 else np.uint32


def write_shard(path, tokens, vocab, attrs=None, vocab_table=None, tokenizer_json=None):
    """tokens: a 1-D array (or memmap) of ids in [0, vocab), written in pieces of
    CHUNK so a file larger than memory converts; vocab_table: a list of bytes, one
    per id, or None; tokenizer_json: the bytes of the tokenizer.json that made the
    tokens (/tokenizer_json), or None."""
    tmp = path + ".tmp"
    dtype = token_dtype(vocab)
    with h5py.File(tmp, "w") as f:
        d = f.create_dataset("tokens", shape=(len(tokens),), dtype=dtype)
        for start in range(0, len(tokens), CHUNK):
            d[start:start + CHUNK] = np.asarray(tokens[start:start + CHUNK]).astype(dtype)
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.attrs["vocab_size"] = np.int64(vocab)
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
        if vocab_table is not None:
            assert len(vocab_table) == vocab
            offsets = np.zeros(vocab + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(b) for b in vocab_table])
            f.create_dataset("vocab_bytes", data=np.frombuffer(b"".join(vocab_table), dtype=np.uint8))
            f.create_dataset("vocab_offsets", data=offsets)
        if tokenizer_json is not None:
            f.create_dataset("tokenizer_json", data=np.frombuffer(tokenizer_json, dtype=np.uint8))
    os.replace(tmp, path)


def read_vocab(f):
    """The vocabulary of an open shard as a list of bytes, or None."""
    if "vocab_bytes" not in f:
        return None
    data, off = f["vocab_bytes"][...].tobytes(), f["vocab_offsets"][...]
    return [data[off[v]:off[v + 1]] for v in range(len(off) - 1)]


def write_split(out_dir, name, tokens, per_shard, vocab, attrs=None, vocab_table=None):
    """tokens cut into shards of per_shard: OUT_DIR/<name>_000.h5, ...; their paths."""
    paths = []
    for k, start in enumerate(range(0, len(tokens), per_shard)):
        path = os.path.join(out_dir, f"{name}_{k:03d}.h5")
        write_shard(path, tokens[start:start + per_shard], vocab, attrs, vocab_table)
        paths.append(path)
    return paths
