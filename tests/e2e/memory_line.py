#!/usr/bin/env python3
"""Rank 0's start-up memory line: printed once, with numbers that follow from the
model and the optimizer on the tiny set (2 ranks):

- parameters = gradients = 4 x the model's parameter count (its summary's total);
- optimizer state = 0, 1 and 2 x the parameters for SGD without momentum, SGD with
  momentum and AdamW;
- activations = 4 x batch x (every layer's output + the gradients between layers +
  what layers and their libraries keep): linear(8), relu, linear(3) on 16 features, the relu done in the
  first linear's passes (its output and gradient are the linear's): outputs 8 + 3,
  the gradient into the second linear 8 and the loss's into the model 3, and each
  linear's column of ones for its bias gradient, 1 + 1, at batch 8: 768 bytes;
- the total is their sum;
- the line after it, rank 0's checkpoint file in memory: 4 x (1 + the state's
  copies) x the parameters (the tiny model has no buffers), the whole state under
  ZeRO too, where the memory line counts rank 0's share (of a model of 2,563
  parameters there: 2,048 of them, shares being whole pages).

usage: memory_line.py MPIEXEC DDP_TRAIN TINY.nml RUN_PREFIX
"""
import re
import subprocess
import sys

LINE = re.compile(r"^memory per rank: parameters [0-9.]+ MB \((\d+) B\), gradients [0-9.]+ MB \((\d+) B\), "
                  r"optimizer state [0-9.]+ MB \((\d+) B\), activations [0-9.]+ MB \((\d+) B\) \(planned at batch "
                  r"(\d+): [^)]*\), in all [0-9.]+ MB \((\d+) B\)$", re.M)
CHECKPOINT = re.compile(r"^checkpoints: rank 0 holds each checkpoint file in host memory while it writes it, besides "
                        r"the above: about [0-9.]+ MB \((\d+) B\), the parameters, buffers and whole optimizer state$",
                        re.M)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


mpiexec, binary, nml, prefix = sys.argv[1:5]
for name, overrides, copies in (("sgd", ["train.momentum=0"], 0), ("momentum", ["train.momentum=0.9"], 1),
                                ("adamw", ["train.optimizer=adamw"], 2),
                                ("adamw_zero", ["train.optimizer=adamw", "comm.zero=1",
                                                "model.layers='linear(128)','relu','linear(3)'"], 2)):
    zero = name.endswith("zero")
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, nml, f"io.run_dir={prefix}_{name}",
           "train.epochs=1", "io.checkpoint_every=0", *overrides]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    print(f"$ {' '.join(cmd)}\n{p.stdout}--- standard error\n{p.stderr}--- exit {p.returncode}")
    if p.returncode != 0:
        fail(f"{name}: exit {p.returncode}")
    lines = LINE.findall(p.stdout)
    if len(lines) != 1:
        fail(f"{name}: {len(lines)} memory lines, expected 1")
    params, grads, state, acts, batch, total = map(int, lines[0])
    n = int(re.search(r"total parameters: (\d+)", p.stdout).group(1))
    print(f"{name}: {n} parameters; bytes: parameters {params}, gradients {grads}, optimizer state {state}, "
          f"activations {acts} at batch {batch}, in all {total}")
    if params != 4 * n or grads != 4 * n:
        fail(f"{name}: parameters {params} B, gradients {grads} B for {n} parameters")
    if (state >= copies * 4 * n) if zero else (state != copies * 4 * n):
        fail(f"{name}: optimizer state {state} B, expected {'less than ' if zero else ''}{copies} x {4 * n}")
    if not zero and (batch != 8 or acts != 4 * 8 * (8 + 3 + 8 + 3 + 1 + 1)):
        fail(f"{name}: activations {acts} B at batch {batch}, expected 768 B at 8")
    if total != params + grads + state + acts:
        fail(f"{name}: the total {total} is not the sum")
    checkpoint = [int(b) for b in CHECKPOINT.findall(p.stdout)]
    if checkpoint != [(1 + copies) * 4 * n]:
        fail(f"{name}: checkpoint lines {checkpoint}, expected one of {(1 + copies) * 4 * n} B")
print("PASS")
