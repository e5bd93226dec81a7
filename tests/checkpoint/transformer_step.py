#!/usr/bin/env python3
"""One AdamW step of a transformer from PyTorch's weights, against PyTorch's step, on NP
ranks: a nanoGPT-shaped GPT (its own names: transformer.wte, wpe, h.<i>.attn.c_attn,
..., lm_head tied to wte; causal attention as nanoGPT computes it) on token windows, or
torchvision's VisionTransformer on images. Its state_dict goes through tools/torch_to_h5
(the name tables) into io.init_from; ddp_train trains one step of the whole set (N
samples, shuffle off: rank r takes samples r, r + NP, ...); PyTorch takes the same step
(the loss the mean over every target token, or sample, of all ranks; AdamW with weight
decay on the tensors of 2 or more dimensions only, as nanoGPT's configure_optimizers
and train.decay_norm_and_bias = F; clip_grad_norm_ at 0.25, below the norm), and its weights after it go
through torch_to_h5 too. Every tensor of ddp_train's checkpoint equals PyTorch's within
TOL (||ours - torch|| / ||torch||, and the same of the step's change, printed); the
attention's key bias, whose gradient is zero but for rounding, within lr.
A Hugging Face GPT-2 state_dict (Conv1D weights stored (in, out)) of the same weights
converts to the same file as nanoGPT's. Back: ddp_train's checkpoint through
tools/h5_to_torch loads into a new model of PyTorch's class (nanoGPT's or Hugging Face's
names, torchvision's), is the checkpoint again through torch_to_h5, and gives the
stepped PyTorch model's logits.

usage: transformer_step.py gpt|vit NP MPIEXEC DDP_TRAIN TORCH_TO_H5 WORK_DIR
"""
import math
import os
import shutil
import sys

import h5py
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from common import fail, latest, mpirun, run

kind, nprocs, mpiexec, binary, torch_to_h5, work = sys.argv[1], int(sys.argv[2]), *sys.argv[3:7]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work + "/data")
torch.set_num_threads(1)
torch.manual_seed(5)
TOL = 1e-5
MAX_NORM = 0.25  # clip_grad_norm: below both models' gradient norms, so the step clips
N = 8  # samples: one step of all of them


class CausalSelfAttention(nn.Module):
    """nanoGPT's: c_attn (3d, d) gives q, k, v in that order; c_proj."""

    def __init__(self, d, heads, T):
        super().__init__()
        self.c_attn, self.c_proj, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))  # nanoGPT's mask

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # nanoGPT's path without flash attention (torch before 2.0)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads, T):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), CausalSelfAttention(d, heads, T), nn.LayerNorm(d)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(d, 4 * d), c_proj=nn.Linear(4 * d, d)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, d, heads, L):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, d), wpe=nn.Embedding(T, d),
                                              h=nn.ModuleList([Block(d, heads, T) for _ in range(L)]),
                                              ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT
        for n, p in self.named_parameters():  # nanoGPT's init, and non-trivial norms
            if n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                nn.init.uniform_(p, 0.5, 1.5)
            elif n.endswith("bias"):
                nn.init.uniform_(p, -0.1, 0.1)
            else:
                nn.init.normal_(p, 0.0, 0.02 if not n.endswith("wpe.weight") else 0.1)

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def to_h5(state, name):
    path = f"{work}/{name}.pt"
    torch.save(state, path)
    rc, out, _ = run(["/usr/bin/env", sys.executable, torch_to_h5, path, f"{work}/{name}.h5"])
    if rc != 0:
        fail(f"torch_to_h5 {name} exited {rc}")
    with h5py.File(f"{work}/{name}.h5", "r") as f:
        return {k: f["model"][k][()] for k in f["model"]}, out


if kind == "gpt":
    V, T, d, heads, L = 24, 16, 32, 2, 2
    net = GPT(V, T, d, heads, L)
    new_model = lambda shape=(V, T, d, heads, L): GPT(*shape)  # noqa: E731 (the loop below reuses d)
    tokens = np.random.default_rng(3).integers(0, V, N * T + 1)
    with h5py.File(work + "/data/train_000.h5", "w") as f:
        f.create_dataset("tokens", data=tokens.astype(np.uint16))
        f.attrs["vocab_size"] = np.int64(V)
    windows = torch.from_numpy(np.stack([tokens[i * T:i * T + T + 1] for i in range(N)]))
    X, Y = windows[:, :-1], windows[:, 1:]
    # The first block's attention keeps its probabilities, the second's works in
    # blocks of 5 queries (5 + 5 + 5 + 1) and recomputes them: both paths in one step.
    layers = [f"'embedding({V}, {d})'", f"'pos_embedding({T})'", f"'transformer_block({heads}, causal, tanh)'"] \
        + [f"'transformer_block({heads}, causal, tanh, block=5)'"] * (L - 1) \
        + ["'layernorm'", f"'linear({V}, bias=false, tied)'"]
    data_line, per_sample = f"seq_len = {T}", T
    betas, decay, lr = (0.9, 0.95), 0.1, 3e-3
    # The same weights as Hugging Face's GPT2LMHeadModel stores them: Conv1D (in, out).
    sd = net.state_dict()
    hf = {k: (v.t().contiguous() if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else v)
          for k, v in sd.items()}
else:
    from torchvision.models.vision_transformer import VisionTransformer
    side, patch, d, heads, L, classes = 16, 4, 16, 2, 2, 5
    net = VisionTransformer(image_size=side, patch_size=patch, num_layers=L, num_heads=heads, hidden_dim=d,
                            mlp_dim=4 * d, num_classes=classes)
    new_model = lambda shape=(side, patch, L, heads, d, classes): VisionTransformer(  # noqa: E731
        image_size=shape[0], patch_size=shape[1], num_layers=shape[2], num_heads=shape[3], hidden_dim=shape[4],
        mlp_dim=4 * shape[4], num_classes=shape[5])
    with torch.no_grad():  # torchvision zeroes the head and the class token: make them count
        for n, p in net.named_parameters():
            if n.startswith("heads.") or n == "class_token":
                p.normal_(0.0, 0.2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((N, 3, side, side)).astype(np.float32)
    y = rng.integers(0, classes, N).astype(np.int64)
    with h5py.File(work + "/data/train_000.h5", "w") as f:
        f.attrs["format"] = "ddp_train.shard"
        f.attrs["version"] = 1
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    layers = [f"'patch_embed({patch}, {d})'", "'class_token'", f"'pos_embedding({(side // patch) ** 2 + 1})'"] \
        + [f"'transformer_block({heads}, eps=1e-6)'"] + [f"'transformer_block({heads}, eps=1e-6, block=8)'"] * (L - 1) \
        + ["'layernorm(eps=1e-6)'", "'token_pool'", f"'linear({classes})'"]  # the second in blocks of 8 of 17
    data_line, per_sample = "shuffle = F", 1
    betas, decay, lr = (0.9, 0.999), 0.05, 1e-3
    sd, hf = net.state_dict(), None

nml = work + "/model.nml"
with open(nml, "w") as f:
    f.write(f"""&data train_files = '{work}/data/train_*.h5', shuffle = F{', ' + data_line if kind == 'gpt' else ''} /
&model layers = {', '.join(layers)} /
&train epochs = 1, batch_size = {N // nprocs}, optimizer = 'adamw', lr = {lr}, betas = {betas[0]}, {betas[1]},
       weight_decay = {decay}, decay_norm_and_bias = F, clip_grad_norm = {MAX_NORM}, seed = 3, log_every = 1 /
""")
initial, out = to_h5(sd, "initial")
print(out.splitlines()[0])
if hf is not None:
    hf_h5, hf_out = to_h5(hf, "hf")
    print(hf_out.splitlines()[0])
    same = sorted(hf_h5) == sorted(initial) and all(np.array_equal(hf_h5[k], initial[k]) for k in initial)
    print(f"Hugging Face's layout converts to nanoGPT's file: {same}")
    if not same or "Hugging Face" not in hf_out:
        fail("the Hugging Face GPT-2 state_dict did not convert to nanoGPT's tensors")
    if "lm_head tied to wte: not written" not in out or "0.weight" not in initial or "5.weight" in initial:
        fail("the tied head was not recognised")

# PyTorch's step: rank r's samples r, r + NP, ...; the loss their tokens' mean over all.
net.train()
decayed = [p for p in net.parameters() if p.dim() >= 2]
others = [p for p in net.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decayed, "weight_decay": decay}, {"params": others, "weight_decay": 0.0}],
                        lr=lr, betas=betas, eps=1e-8)
loss = 0.0
for r in range(nprocs):
    logits = net(X[r::nprocs])
    loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y[r::nprocs].reshape(-1), reduction="sum")
loss = loss / (N * per_sample)
opt.zero_grad()
loss.backward()
norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM))
opt.step()
expect, _ = to_h5(net.state_dict(), "after")
print(f"PyTorch: loss {float(loss):.6f}, gradient norm {norm:.6f}, clipped to {MAX_NORM}")
if not norm > MAX_NORM:
    fail(f"the gradient norm {norm} is below clip_grad_norm {MAX_NORM}: the step would not clip")

run_dir = f"{work}/run"
rc, out, _ = run(mpirun(mpiexec, nprocs, binary, [nml, f"io.init_from={work}/initial.h5", f"io.run_dir={run_dir}"]),
                 timeout=300)
if rc != 0:
    fail(f"ddp_train exited {rc}")
with h5py.File(os.path.join(run_dir, "checkpoints", latest(run_dir)), "r") as f:
    got = {k[len("layers."):]: f["model"][k][()] for k in f["model"]}
if sorted(got) != sorted(expect):
    fail(f"tensors {sorted(got)} vs PyTorch's {sorted(expect)}")
worst = 0.0
for k in sorted(expect):
    e, g, i = (a.astype(np.float64) for a in (expect[k], got[k], initial[k]))
    if k.endswith("self_attention.in_proj_bias"):
        # The key's bias moves no score (q.(k + b) shifts a query's scores alike, and softmax
        # ignores that): its gradient is zero but for rounding (1e-9 here), and AdamW's first
        # step, g / (|g| + eps), makes that noise a move of up to lr. Both sides' moves are
        # noise: within lr of each other; the query's and value's biases as the rest.
        d_model = e.shape[0] // 3
        kb = slice(d_model, 2 * d_model)
        noise = float(np.abs(g[kb] - e[kb]).max())
        print(f"  {k}: the key's bias (zero gradient) within {noise:.2e} of PyTorch's (allowed: lr = {lr})")
        if not noise <= lr:
            fail(f"{k}: the key's bias moved {noise:.2e} from PyTorch's, more than lr")
        e, g, i = (np.concatenate([a[:d_model], a[2 * d_model:]]) for a in (e, g, i))
    d = float(np.linalg.norm(g - e) / np.linalg.norm(e))
    dc = float(np.linalg.norm(g - e) / np.linalg.norm(e - i))
    worst = max(worst, d)
    print(f"  {k} {g.shape}: relative difference {d:.2e} (of the step's change {dc:.2e})")
    if not d <= TOL:
        fail(f"{k} after the step differs from PyTorch's by {d:.2e} > {TOL}")

# Back into PyTorch: the checkpoint through tools/h5_to_torch (the tables read
# backwards) into a new model of PyTorch's class; missing keys only the causal-mask
# buffers, none unexpected, the head still tied; through torch_to_h5 again it is the
# checkpoint bit for bit; its logits are the stepped PyTorch model's.
h5_to_torch = os.path.join(os.path.dirname(torch_to_h5), "h5_to_torch")
ckpt = os.path.join(run_dir, "checkpoints", latest(run_dir))


def back_to_torch(names):
    rc, out, _ = run(["/usr/bin/env", sys.executable, h5_to_torch, ckpt, f"{work}/back_{names}.pt", "--names", names])
    if rc != 0:
        fail(f"h5_to_torch --names {names} exited {rc}")
    return torch.load(f"{work}/back_{names}.pt")


back = new_model()
loaded = back_to_torch("nanogpt" if kind == "gpt" else "torchvision_vit")
missing, unexpected = back.load_state_dict(loaded, strict=False)
if unexpected or any(not m.endswith(".attn.bias") for m in missing):
    fail(f"h5_to_torch's state_dict: missing {missing}, unexpected {unexpected}")
if kind == "gpt" and back.lm_head.weight is not back.transformer.wte.weight:
    fail("the loaded GPT's head is no longer tied to its embedding")
again, _ = to_h5(back.state_dict(), "again")
if sorted(again) != sorted(got) or not all(np.array_equal(again[k], got[k]) for k in got):
    fail("the checkpoint through h5_to_torch and torch_to_h5 is not the checkpoint")
net.eval(), back.eval()
with torch.no_grad():
    theirs, ours = net(X).double(), back(X).double()
rel = float((ours - theirs).norm() / theirs.norm())
print(f"h5_to_torch: {len(loaded)} tensors load into {type(back).__name__} (missing only {len(missing)} mask "
      f"buffers); its logits within {rel:.2e} of PyTorch's stepped model's")
if not rel <= 1e-4:
    fail(f"the loaded model's logits differ from PyTorch's by {rel:.2e}")
if kind == "gpt":  # Hugging Face's names: the same tensors, its Conv1D weights (in, out)
    hf_back = back_to_torch("hf_gpt2")
    conv1d = lambda k: k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
    if sorted(hf_back) != sorted(loaded) or not all(
            torch.equal(hf_back[k], loaded[k].t() if conv1d(k) else loaded[k]) for k in loaded):
        fail("h5_to_torch --names hf_gpt2 is not nanogpt's tensors with the Conv1D weights transposed")
print(f"PASS: {kind} on {nprocs} rank(s), {len(expect)} tensors, worst relative difference {worst:.2e}")
