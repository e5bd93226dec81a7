#!/usr/bin/env python3
"""How far PyTorch's own bf16 training step (autocast: bf16 operands and bf16 outputs of
its convolutions and GEMMs, fp32 accumulation) lies from its fp32 step, on step_compare's
cases: the yardstick for the tolerance of ddp_train's GPU bf16 step where cuDNN's bf16
kernels store their outputs in bf16 (DDP_CUDNN_NARROW=1), which rounds as AMP does.

usage: torch_amp_gap.py STEP_COMPARE [--device cpu|cuda] [--seeds N] [CASE ...]

For each case (`STEP_COMPARE list`; the committed ones unless named) and each of N
seeds: the model as tools/torch_bench.py builds it, PyTorch's default initialisation,
a batch of 8 U(0, 1) images with random labels, cross-entropy, one SGD step (lr 0.1,
momentum 0.9, weight decay 5e-4, as step_compare's), once in fp32 (TF32 off) and once
under autocast bf16 (on CUDA with channels_last, PyTorch's AMP recipe) from the same
state. Measured as step_compare measures: max |bf16 - fp32| / max |fp32| per tensor
(logits, loss, every gradient, parameter and running statistic after the step), and
over the whole step sqrt(sum |d|^2 / sum |fp32|^2). Prints one line per case with the
worst over the seeds.
"""
import os
import subprocess
import sys

# PyTorch runs without a cap on oneDNN's instruction set, set to test ddp_train's AVX2
# path on a larger CPU: Debian's PyTorch reads the same variable and, capped below
# AVX-512, has no bf16 kernels for autocast (tests/e2e/bench_tools.py). Before torch
# loads oneDNN.
for _cap in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
    os.environ.pop(_cap, None)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_bench import build_model  # noqa: E402

BATCH, CLASSES = 8, 10


def cases(step_compare, names):
    out = subprocess.run([step_compare, "list"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        name, shape, layers = line.split("\t")
        found[name] = ([int(d) for d in shape.split(",")], layers.split(";"))
    committed = [n for n in found if n != "resnet50_224"]
    for n in names:
        if n not in found:
            sys.exit(f"torch_amp_gap: no case '{n}' (step_compare has {', '.join(found)})")
    return [(n, *found[n]) for n in (names or committed)]


def step(model, x, y, device, amp):
    """One training step from model's current state; its tensors after, by name."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    if amp and device == "cuda":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
    opt.zero_grad()
    loss.backward()
    t = {"logits": logits.float(), "loss": loss.reshape(1)}
    t.update({"grad/" + n: p.grad for n, p in model.named_parameters()})
    opt.step()
    t.update({"param_after/" + n: p for n, p in model.named_parameters()})
    t.update({"buffer_after/" + n: b for n, b in model.named_buffers() if b.is_floating_point()})
    return {k: v.detach().double().cpu().numpy().ravel() for k, v in t.items()}


def gap(name, shape, layers, device, seed):
    torch.manual_seed(seed)
    model = build_model(layers, shape).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(BATCH, *shape, device=device)
    y = torch.randint(0, CLASSES, (BATCH,), device=device)
    ref = step(model, x, y, device, amp=False)
    model.load_state_dict(state)
    got = step(model, x, y, device, amp=True)
    worst, worst_name, forward, d2, r2 = 0.0, "", 0.0, 0.0, 0.0
    for k, r in ref.items():
        d = got[k] - r
        err = np.abs(d).max() / max(np.abs(r).max(), 1e-30)
        if k in ("logits", "loss"):
            forward = max(forward, err)
        if err > worst:
            worst, worst_name = err, k
        d2 += float((d * d).sum())
        r2 += float((r * r).sum())
    return forward, worst, worst_name, (d2 / r2) ** 0.5


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__.split("\n\n")[1])
    step_compare, rest = args[0], args[1:]
    device, seeds, names = "cpu", 5, []
    while rest:
        a = rest.pop(0)
        if a == "--device":
            device = rest.pop(0)
        elif a == "--seeds":
            seeds = int(rest.pop(0))
        else:
            names.append(a)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print(f"torch_amp_gap: PyTorch {torch.__version__} on {device}, autocast bf16 against fp32, "
          f"{seeds} seeds, batch {BATCH}")
    for name, shape, layers in cases(step_compare, names):
        rows = [gap(name, shape, layers, device, s) for s in range(seeds)]
        forward = max(r[0] for r in rows)
        worst = max(rows, key=lambda r: r[1])
        whole = max(r[3] for r in rows)
        print(f"{name:12s} logits/loss {forward:.3g}; worst tensor {worst[1]:.3g} ({worst[2]}); "
              f"whole step (L2) {whole:.3g}")


if __name__ == "__main__":
    main()
