#!/usr/bin/env python3
"""PyTorch's side of `tools/bench_all --torch`: trains the model of a ddp_train input
file for one epoch under torch.distributed (gloo, DistributedDataParallel), one
thread per rank, and prints the samples/s as ddp_bench does.

usage: tools/torch_bench.py [--device cpu|cuda] [--mode eager|amp|compile|compile_fp32] [--warmup W]
                            [--profile P] [-n N] INPUT.nml [group.key=value ...]
       (or torchrun --nproc_per_node N tools/torch_bench.py INPUT.nml ...)

With -n it starts its N ranks itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT on
127.0.0.1), one process each, as torchrun would.

Overrides as ddp_train takes them (`data.train_files=data/x/train_000.h5`,
`model.layers=flatten,linear(10)`), for the keys read here.

The same model (model.layers, PyTorch's default initialisation; attention as nanoGPT
writes it, F.scaled_dot_product_attention, PyTorch's fastest eager form), the same
per-rank batch, optimizer (SGD with momentum and weight decay, or AdamW with its
betas and decoupled decay, as in the input; the schedule's peak learning rate;
train.clip_grad_norm), the same training shards preloaded into memory as
ddp_train's preload mode does (uint8 pixels scaled by 1/255; token shards as
data.seq_len's windows, the loss over every token), and DistributedSampler's
shuffled, padded split of the epoch. The epoch is timed as ddp_train's is: from its
first batch to the last optimizer step, no validation. Prints one line:
  torch_bench: INPUT, N rank(s), device D, mode M, batch B per rank, S steps, samples/s X,
               [tokens/s K,] torch V, threads T, parameters P, final loss L

--device cuda (one GPU per rank; NCCL between ranks, none for one): the shards are
held in GPU memory as they are stored (uint8 pixels are scaled on the GPU per batch,
as ddp_train's GPU build does), W warm-up steps (default 10 on a GPU, 0 on the CPU)
and, where the epoch ends in a short batch, one step of that shape run before the
timed epoch, and the clock waits for the GPU. --mode:
  eager    float32 (TF32 off, as ddp_train's fp32; on with train.tf32=T: "eager fp32 (TF32)")
  amp      torch.autocast bf16, model and batches channels_last (PyTorch's AMP recipe)
  compile  torch.compile of the amp model (its compilation in the warm-up steps)
  compile_fp32  torch.compile of the float32 model (the CPU's comparison; on the CPU
           the warm-up is then 3 steps by default, the first steps' compilations)

--profile P: after the timed epoch, P more steps under torch.profiler; rank 0 prints
their time per step by kind of work (convolution forward, backward data, backward
filter, GEMM, batch norm, element-wise, ...: the kinds ddp_bench's
DDP_LAUNCH_COUNT=times and =device print ddp_train's step in), then the longest
kernels by name. On a GPU the times are the kernels' own on the device; on the CPU
the operators' self times.
"""
import glob
import os
import re
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
from torch import nn


def namelist_values(path):
    """group.key -> raw value text, for the few keys read here. Comments (! outside
    quotes) removed; a value runs to the next `key =` outside quotes (values span
    lines, and quoted layer specs hold `pad=1`)."""
    values = {}
    group = None
    key, value = None, ""
    for line in open(path):
        # drop a comment: the first ! outside quotes
        out, quoted = "", False
        for ch in line:
            if ch == "'":
                quoted = not quoted
            if ch == "!" and not quoted:
                break
            out += ch
        tokens = re.findall(r"'[^']*'|[^'\s=,]+|=|,", out)
        for i, tok in enumerate(tokens):
            if tok.startswith("&"):
                group = tok[1:]
            elif tok == "/":
                if key:
                    values[f"{group}.{key}"] = value.strip(" ,")
                group, key, value = None, None, ""
            elif i + 1 < len(tokens) and tokens[i + 1] == "=" and not tok.startswith("'"):
                if key:
                    values[f"{group}.{key}"] = value.strip(" ,")
                key, value = tok, ""
            elif tok != "=":
                value += tok + " "
    return values


def strings(value):
    """The items of a string array: quoted in the file; bare and comma-separated
    (commas inside parentheses kept) in an override."""
    quoted = re.findall(r"'([^']*)'", value)
    return quoted if quoted else [v.strip() for v in re.findall(r"(?:[^,(]|\([^)]*\))+", value) if v.strip()]


class BasicBlock(nn.Module):
    """resblock(planes[, stride=s]): torchvision's BasicBlock, as ddp_train's."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    """bottleneck(width[, stride=s]): torchvision's Bottleneck (ResNet-50 v1.5: the stride
    in the 3x3), as ddp_train's; the same module names, so state dicts map one to one."""
    expansion = 4

    def __init__(self, inplanes, width, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, 4 * width, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inplanes != 4 * width:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, 4 * width, 1, stride, bias=False),
                                            nn.BatchNorm2d(4 * width))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class Attention(nn.Module):
    """attention(heads[, causal]): nanoGPT's CausalSelfAttention, PyTorch's fastest eager
    form (one QKV projection, F.scaled_dot_product_attention, the output projection).
    Not the same parameters' names as ddp_train's (nn.MultiheadAttention's): timed, not
    compared."""

    def __init__(self, d, heads, causal):
        super().__init__()
        self.qkv, self.proj, self.heads, self.causal = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, causal

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(nn.functional, "scaled_dot_product_attention"):
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:  # PyTorch 1.x (Debian's, the tests'): the plain form
            a = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
            if self.causal:
                a = a.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            y = a.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    """transformer_block(heads[, mlp=r][, causal][, tanh][, eps=e][, block=N][, fused]): the
    pre-norm block (block=N and fused ignored, as attention's)."""

    def __init__(self, d, heads, mlp, causal, tanh, eps):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d, eps), Attention(d, heads, causal), nn.LayerNorm(d, eps)
        self.mlp = nn.Sequential(nn.Linear(d, mlp * d), nn.GELU(approximate="tanh" if tanh else "none"),
                                 nn.Linear(mlp * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Positions(nn.Module):
    """pos_embedding(P): x + weight[:T]."""

    def __init__(self, positions, d, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(positions, d) * std)

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class ClassToken(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, 1, d))

    def forward(self, x):
        return torch.cat([self.weight.expand(x.shape[0], -1, -1), x], 1)


class Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def build_model(specs, sample_shape):
    """The layer list as PyTorch modules. sample_shape: (C, H, W) or (n) of a sample, or
    (T,) of token ids, which the first layer (an embedding) takes."""
    layers, shape = [], list(sample_shape)
    embedding = None
    for spec in specs:
        m = re.fullmatch(r"(\w+)(?:\((.*)\))?", spec.strip())
        name, args = m.group(1), [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
        flags = {"sync", "zero_init", "causal", "tanh", "tied", "mean", "fused"}  # fused: PyTorch's SDPA anyway
        pos = [int(a) for a in args if "=" not in a and a not in flags]
        kw = dict(a.split("=") if "=" in a else (a, "true") for a in args if "=" in a or a in flags)
        if name == "flatten":
            layers.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif name == "linear":  # on the last dimension: a flat sample's or a sequence's
            layers.append(nn.Linear(shape[-1], pos[0], bias=kw.get("bias", "true") != "false"))
            if "tied" in kw:
                layers[-1].weight = embedding.weight
            shape = shape[:-1] + [pos[0]]
        elif name == "relu":
            layers.append(nn.ReLU())
        elif name == "tanh":
            layers.append(nn.Tanh())
        elif name == "gelu":
            layers.append(nn.GELU(approximate="tanh" if "tanh" in kw else "none"))
        elif name == "layernorm":
            layers.append(nn.LayerNorm(shape[-1], float(kw.get("eps", "1e-5"))))
        elif name == "embedding":
            embedding = nn.Embedding(pos[0], pos[1])  # N(0, 1), or N(0, std^2) as ddp_train's std=
            nn.init.normal_(embedding.weight, 0.0, float(kw.get("std", "1")))
            layers.append(embedding)
            shape = shape + [pos[1]]
        elif name == "pos_embedding":
            layers.append(Positions(pos[0], shape[-1], float(kw.get("std", "1"))))
        elif name == "attention":
            layers.append(Attention(shape[-1], pos[0], "causal" in kw))
        elif name == "transformer_block":
            layers.append(Block(shape[-1], pos[0], int(kw.get("mlp", "4")), "causal" in kw, "tanh" in kw,
                                float(kw.get("eps", "1e-5"))))
        elif name == "patch_embed":
            p, d = pos
            layers += [nn.Conv2d(shape[0], d, p, p), Lambda(lambda x: x.flatten(2).transpose(1, 2))]
            shape = [shape[1] // p * (shape[2] // p), d]
        elif name == "class_token":
            layers.append(ClassToken(shape[-1]))
            shape = [shape[0] + 1, shape[1]]
        elif name == "token_pool":
            layers.append(Lambda((lambda x: x.mean(1)) if "mean" in kw else (lambda x: x[:, 0])))
            shape = [shape[-1]]
        elif name == "conv2d":
            out, k = pos[0], pos[1]
            stride, pad = int(kw.get("stride", 1)), int(kw.get("pad", 0))
            layers.append(nn.Conv2d(shape[0], out, k, stride, pad, bias=kw.get("bias", "true") != "false"))
            shape = [out] + [(d + 2 * pad - k) // stride + 1 for d in shape[1:]]
        elif name in ("maxpool", "avgpool"):
            k, stride, pad = pos[0], int(kw.get("stride", pos[0])), int(kw.get("pad", 0))
            layers.append((nn.MaxPool2d if name == "maxpool" else nn.AvgPool2d)(k, stride, pad))
            shape = [shape[0]] + [(d + 2 * pad - k) // stride + 1 for d in shape[1:]]
        elif name == "batchnorm2d":
            if "sync" in args:
                sys.exit(f"torch_bench: layer '{spec}' is not built here (SyncBatchNorm)")
            layers.append(nn.BatchNorm2d(shape[0]))
        elif name in ("resblock", "bottleneck"):
            block = BasicBlock if name == "resblock" else Bottleneck
            width, stride = pos[0], int(kw.get("stride", 1))
            if kw.get("sync", "false") == "true":
                sys.exit(f"torch_bench: layer '{spec}' is not built here (SyncBatchNorm)")
            layers.append(block(shape[0], width, stride))
            if kw.get("zero_init", "false") == "true":
                nn.init.zeros_((layers[-1].bn2 if name == "resblock" else layers[-1].bn3).weight)
            shape = [block.expansion * width] + [(d + 2 - 3) // stride + 1 for d in shape[1:]]
        elif name == "globalavgpool":
            layers.append(nn.AdaptiveAvgPool2d(1))
            shape = [shape[0], 1, 1]
        else:
            sys.exit(f"torch_bench: layer '{spec}' is not built here (flatten, linear, relu, tanh, gelu, "
                     "layernorm, embedding, pos_embedding, attention, transformer_block, patch_embed, "
                     "class_token, token_pool, conv2d, maxpool, avgpool, batchnorm2d, resblock, bottleneck, "
                     "globalavgpool)")
    return nn.Sequential(*layers)


def launch(n, args):
    """Start n ranks of this script on this host; the exit status is the worst one's."""
    import socket
    import subprocess
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__] + args,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(n)]
    return max(abs(p.wait()) for p in procs)


def options(argv):
    """--device, --mode, --warmup, --profile and -n before INPUT; the rest is INPUT and overrides."""
    opts = {"device": "cpu", "mode": "eager", "warmup": None, "profile": None, "n": None}
    i = 0
    while i < len(argv) and argv[i] in ("--device", "--mode", "--warmup", "--profile", "-n"):
        if i + 1 >= len(argv):
            sys.exit(f"torch_bench: {argv[i]} needs a value")
        opts[argv[i].lstrip("-")] = argv[i + 1]
        i += 2
    if opts["device"] not in ("cpu", "cuda"):
        sys.exit(f"torch_bench: --device {opts['device']}: cpu or cuda")
    if opts["mode"] not in MODE_NAMES:
        sys.exit(f"torch_bench: --mode {opts['mode']}: {', '.join(MODE_NAMES)}")
    if i >= len(argv):
        sys.exit("usage: tools/torch_bench.py [--device cpu|cuda] [--mode eager|amp|compile|compile_fp32] [--warmup W] "
                 "[--profile P] [-n N] INPUT.nml [group.key=value ...]")
    return opts, argv[:i], argv[i:]


# The kinds of work a step's kernels (on a GPU) or operators (on the CPU) are sorted
# into, by name: the first pattern that matches. ddp_bench sorts ddp_train's kernels
# and calls into the same kinds by their labels (tools/ddp_bench.cpp, kind_of).
KINDS = [
    ("copies", r"^Memcpy|^Memset"),
    ("loss", r"softmax|nll_loss|cross_entropy"),
    ("convolution forward", r"fprop|conv\w*fwd|fwd\w*conv|implicit_convolve|convolution$|conv2d$"),
    ("convolution backward data", r"dgrad|bwd_data|backward_data"),
    ("convolution backward filter", r"wgrad|bwd_filter|backward_filter|bwd_weight|splitKreduce"),
    ("convolution backward (data and filter)", r"convolution_backward"),
    ("conversions and layout", r"nchwToNhwc|nhwcToNchw|direct_copy|copy_kernel|transpose|convert|aten::copy_|_to_copy"),
    ("batch norm", r"batch_norm|batchnorm|bn_fw|bn_bw"),
    ("pooling", r"pool"),
    ("optimizer", r"multi_tensor_apply|sgd|_foreach|Optimizer|non_finite"),
    ("GEMM", r"gemm|gemv|cublas|cutlass|addmm|aten::mm$|matmul"),
    ("element-wise", r"elementwise|threshold|relu|clamp|add|mul|div|fill|where"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.I):
            return kind
    return "other"


def print_profile(prof, steps, seconds, cuda):
    """Rank 0's profile of `steps` steps (`seconds` of wall time): time per step by kind,
    then the longest kernels (operators on the CPU) by name."""
    by_name = {}  # name -> [microseconds, count]
    if cuda:  # the kernels (and copies) on the device, each its own time
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                t = by_name.setdefault(e.name, [0.0, 0])
                t[0] += e.time_range.elapsed_us()
                t[1] += 1
    else:  # the operators' self times on the host
        for a in prof.key_averages():
            if a.self_cpu_time_total > 0:
                by_name[a.key] = [a.self_cpu_time_total, a.count]
    kinds = {}
    for name, (us, n) in by_name.items():
        k = kinds.setdefault(kind_of(name), [0.0, 0])
        k[0] += us
        k[1] += n
    total = sum(us for us, _ in kinds.values())
    what = "kernels' own times on the device" if cuda else "operators' self times on the host"
    print(f"torch_bench profile: {steps} steps of {seconds / steps * 1e3:.3f} ms under the profiler; the {what} "
          f"per step, {total / steps / 1e3:.3f} ms in all, by kind, longest first:")
    for kind, (us, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us / steps / 1e3:10.3f} ms {n / steps:8.2f} x  {kind}")
    print(f"torch_bench profile: the longest {'kernels' if cuda else 'operators'} by name, per step:")
    for name, (us, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"  {us / steps / 1e3:10.3f} ms {n / steps:8.2f} x  {kind_of(name)}: {name[:160]}")
    sys.stdout.flush()


def images(files):
    """The shards' /x (NCHW) and /y (int64), preloaded."""
    xs, ys = [], []
    for f in files:
        with h5py.File(f, "r") as h:
            x = h["x"][()]
            layout = h["x"].attrs.get("layout", b"")
            layout = layout.decode() if isinstance(layout, bytes) else str(layout)
            # NHWC images (tools/images_to_h5, make_synthetic_images) to NCHW, by the rule ddp_train reads them
            if x.ndim == 4 and (layout == "NHWC" or (not layout and x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4))):
                x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            xs.append(x)
            ys.append(h["y"][()])
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def token_windows(files, T):
    """Token shards' windows as ddp_train reads them (docs/data.md): sample i of a shard
    the T + 1 tokens from i T, the first T the input, the next T the targets (int64)."""
    windows = []
    for f in files:
        with h5py.File(f, "r") as h:
            tokens = h["tokens"][()].astype(np.int64)
        n = (len(tokens) - 1) // T
        windows.append(np.lib.stride_tricks.sliding_window_view(tokens, T + 1)[: n * T : T])
    w = np.concatenate(windows)
    return np.ascontiguousarray(w[:, :T]), np.ascontiguousarray(w[:, 1:])


def optimizer(v, params):
    """train.optimizer as the input has it: SGD (momentum, weight decay) or AdamW (betas,
    decoupled weight decay, on weights only with train.decay_norm_and_bias = F)."""
    lr = float(v.get("train.lr", "0.01"))
    weight_decay = float(v.get("train.weight_decay", "0"))
    if v.get("train.optimizer", "sgd").strip("'\" ") != "adamw":
        return torch.optim.SGD(params, lr=lr, momentum=float(v.get("train.momentum", "0")),
                               weight_decay=weight_decay)
    betas = [float(b) for b in v.get("train.betas", "0.9, 0.999").replace(",", " ").split()]
    params = list(params)
    if v.get("train.decay_norm_and_bias", "T").strip(".").upper() in ("F", "FALSE"):
        params = [{"params": [p for p in params if p.dim() >= 2]},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


MODE_NAMES = {"eager": "eager fp32", "amp": "AMP bf16 channels_last", "compile": "torch.compile AMP bf16 channels_last",
              "compile_fp32": "torch.compile fp32"}


def main():
    opts, own, rest = options(sys.argv[1:])
    if opts["n"] is not None:
        # the ranks get the same options, without -n
        passed = [a for i, a in enumerate(own) if a != "-n" and (i == 0 or own[i - 1] != "-n")]
        sys.exit(launch(int(opts["n"]), passed + rest))
    path = rest[0]
    v = namelist_values(path)
    for override in rest[1:]:
        key, _, value = override.partition("=")
        v[key] = value
    cuda = opts["device"] == "cuda"
    tf32 = v.get("train.tf32", "F").strip(".").upper() in ("T", "TRUE")
    if opts["mode"].startswith("compile") and not hasattr(torch, "compile"):
        sys.exit(f"torch_bench: --mode compile needs PyTorch 2.x (this is torch {torch.__version__})")
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_bench: --device cuda, but PyTorch finds no CUDA device")
    files = sorted(f for g in strings(v["data.train_files"]) for f in glob.glob(g))
    if not files:
        sys.exit(f"torch_bench: {v['data.train_files']} matches no file")
    seq_len = int(v.get("data.seq_len", "0"))
    x, y = token_windows(files, seq_len) if seq_len else images(files)
    # On the CPU the pixels are scaled once, as before; on a GPU they stay as stored
    # and each batch is scaled there.
    scale_per_batch = cuda and x.dtype == np.uint8
    if scale_per_batch or seq_len:
        x = torch.from_numpy(x)
    else:
        x = torch.from_numpy(x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8 else x)
    y = torch.from_numpy(y)

    # Under -n or torchrun (RANK set): a process group, gloo on the CPU, NCCL between
    # GPUs; one process started alone runs without.
    launched = "RANK" in os.environ
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        # fp32 is fp32, as ddp_train's, unless train.tf32 = T (in the input or overridden)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    if launched:
        dist.init_process_group("nccl" if cuda else "gloo")
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(int(v.get("train.seed", "1")))
    model = build_model(strings(v["model.layers"]), x.shape[1:]).to(device)
    channels_last = opts["mode"] in ("amp", "compile") and x.ndim == 4
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    run = torch.compile(ddp) if opts["mode"] in ("compile", "compile_fp32") else ddp
    x, y = x.to(device), y.to(device)
    batch = int(v.get("train.batch_size", "64"))
    opt = optimizer(v, ddp.parameters())
    clip = float(v.get("train.clip_grad_norm", "0"))
    loss_fn = nn.CrossEntropyLoss()  # over every token of a window: the mean over B T
    amp = opts["mode"] in ("amp", "compile")

    def step(idx):
        xb = x[idx]
        if scale_per_batch:
            xb = xb.to(torch.float32).div_(255.0)
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            out = run(xb)
            loss = loss_fn(out.reshape(-1, out.shape[-1]), y[idx].reshape(-1))
        loss.backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(ddp.parameters(), clip)
        opt.step()
        return loss

    sampler = torch.utils.data.DistributedSampler(torch.arange(len(y)), num_replicas=world, rank=rank,
                                                  shuffle=True, seed=1)
    sampler.set_epoch(0)
    indices = torch.tensor(list(sampler)).to(device)
    steps = (len(indices) + batch - 1) // batch
    # (torch.compile on the CPU: 3 steps, its compilations of the first step and of the next)
    warmup = int(opts["warmup"]) if opts["warmup"] is not None else (10 if cuda else 3 if "compile" in opts["mode"] else 0)
    for s in range(warmup):  # not timed: cuDNN's autotuning, torch.compile's compilation
        step(indices[(s % steps) * batch:(s % steps + 1) * batch])
    if warmup and len(indices) % batch:  # the short last batch's shape too (a recompilation, a cuDNN search)
        step(indices[(steps - 1) * batch:])

    def wait():
        if cuda:
            torch.cuda.synchronize()
        if distributed:
            dist.barrier()

    wait()
    start = time.perf_counter()
    for s in range(steps):
        loss = step(indices[s * batch:(s + 1) * batch])
    wait()
    seconds = time.perf_counter() - start
    if rank == 0:
        samples = len(indices) * world
        where = f"cuda ({torch.cuda.get_device_name(device)})" if cuda else "cpu"
        mode_name = MODE_NAMES[opts["mode"]] + (" (TF32)" if tf32 and cuda and opts["mode"] == "eager" else "")
        print(f"torch_bench: {path}, {world} rank(s), device {where}, mode {mode_name}, "
              f"batch {batch} per rank, {steps} steps, "
              f"samples/s {samples / seconds:.{1 if samples / seconds >= 10 else 4}f}, "
              + (f"tokens/s {samples * seq_len / seconds:.0f}, " if seq_len else "")
              + f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
              f"parameters {sum(p.numel() for p in model.parameters())}, final loss {loss.item():.4f}", flush=True)
    if opts["profile"] is not None:  # the same steps again, under the profiler
        from torch.profiler import ProfilerActivity, profile
        count = int(opts["profile"])
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        wait()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for s in range(count):
                step(indices[(s % steps) * batch:(s % steps + 1) * batch])
            wait()
            seconds = time.perf_counter() - start
        if rank == 0:
            print_profile(prof, count, seconds, cuda)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
