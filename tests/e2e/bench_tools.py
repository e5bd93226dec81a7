#!/usr/bin/env python3
"""The benchmark programs still run and print their numbers (they are not tests of
speed: nothing here is timed against a limit). gemm_bench and conv_bench on a few
calls; ddp_bench on 2 ranks on one Fashion-MNIST shard of the CNN's layers at a quarter
of its channels (its floor and its floor / actual; its kernel times by label and by
kind, DDP_LAUNCH_COUNT=times and =device), and on gpt_tiny (tokens/s); tools/torch_bench.py, PyTorch's side of
`tools/bench_all --torch`, on gpt_tiny and a small ResNet on 2 ranks (the ResNet's
--profile by kind, and AMP's mode) when a python with torch is given.

usage: bench_tools.py BUILD_DIR SOURCE_DIR MPIEXEC [TORCH_PYTHON]
(run in the test directory, where data/fashion-mnist is)
"""
import json
import os
import re
import subprocess
import sys

build, source, mpiexec = sys.argv[1:4]
torch_python = sys.argv[4] if len(sys.argv) > 4 else ""
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
# PyTorch, the reference, runs without a cap on oneDNN's instruction set
# (ONEDNN_MAX_CPU_ISA, set to test ddp_train's AVX2 path on a larger CPU): Debian's
# PyTorch links the same oneDNN, reads the same variable and, capped below AVX-512,
# has no bf16 kernels for autocast ("could not create a primitive descriptor
# iterator"), where on a real AVX2 CPU it takes its path without them.
torch_env = {k: v for k, v in env.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
shard = "data.train_files=data/fashion-mnist/train_000.h5"
# inputs/fashion_cnn.nml's layers with a quarter of its channels: the same calls and
# kinds of work a step, at a third of its CPU time here (what is checked is the count
# and its times, not the speed)
narrow_cnn = ("model.layers=conv2d(8, 3, pad=1), relu, maxpool(2), conv2d(16, 3, pad=1), relu, maxpool(2), "
              "flatten, linear(32), relu, linear(10)")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def run(cmd, extra_env=None, base_env=None):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=dict(base_env or env, **(extra_env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=240)
    print(p.stdout[-3000:])
    if p.returncode != 0:
        fail(f"{cmd[0]} exited {p.returncode}")
    return p.stdout


def ddp_bench(overrides, launch_count):
    """ddp_bench on 2 ranks on the narrow CNN and one shard with DDP_LAUNCH_COUNT: its output and JSON record."""
    out = run([mpiexec, "-n", "2", "--oversubscribe", os.path.join(build, "ddp_bench"),
               os.path.join(source, "inputs", "fashion_cnn.nml"), shard, narrow_cnn, "io.run_dir=runs/bench_tools",
               *overrides],
              {"DDP_LAUNCH_COUNT": launch_count})
    line = [l for l in out.splitlines() if l.startswith("json: ")]
    if len(line) != 1:
        fail(f"ddp_bench (DDP_LAUNCH_COUNT={launch_count}) printed no json line")
    return out, json.loads(line[0][6:])


def positive(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        fail(f"no {what} in the output")
    values = [float(v) for v in m.groups()]
    if not all(v > 0 for v in values):
        fail(f"{what}: {values}")
    return values


if os.path.exists(os.path.join(build, "gemm_bench")):  # oneDNN's: not in the CUDA build
    out = run([os.path.join(build, "gemm_bench"), "64", "3"])
    positive(r"one MLP step's GEMMs: fp32 ([0-9.]+) us, bf16 ([0-9.]+) us, fp16 \(emulated\) ([0-9.]+) us", out,
             "GEMM totals")
out = run([os.path.join(build, "conv_bench"), "8", "3"])
positive(r"conv time per step ([0-9.]+) ms -> at most ([0-9.]+) samples/s", out, "convolution total")

def kernel_times(out, r, device):
    """The kernel times of a timed count: a part of the counted step; the labels, and
    the kinds, add up to them. device: whether they are the device's (CUDA events)."""
    m = re.search(r"kernels +([0-9.]+) ms per step in Kokkos kernels, ([0-9.]+) ms in cuBLAS/cuDNN calls and own "
                  r"CUDA kernels, (-?[0-9.]+) ms outside them .* counted step's ([0-9.]+) ms \((device times|fenced)",
                  out)
    if not m:
        fail("no kernel times line in the output")
    (inside, calls, outside, counted) = [float(v) for v in m.groups()[:4]]
    if (m.group(5) == "device times") != device or r["device_times"] != int(device):
        fail(f"kernel times are {m.group(5)}, json device_times {r['device_times']}; expected device {device}")
    # The CPU build times no library call (oneDNN's are outside); the GPU build times them.
    gpu = not r["compute"].startswith("oneDNN")
    if not (abs(inside - r["kokkos_kernel_ms_per_step"]) < 1e-3 and abs(calls - r["call_ms_per_step"]) < 1e-3
            and 0 < inside < counted and (calls > 0) == gpu and abs(inside + calls + outside - counted) < 3e-3):
        fail(f"kernel times: {inside} + {calls} + {outside} ms of {counted}, json {r['kokkos_kernel_ms_per_step']} "
             f"and {r['call_ms_per_step']}")
    by_label, _, by_kind = out[m.end():].partition("  kinds ")
    for name, lines in (("label", by_label), ("kind", by_kind.partition("  memory")[0])):
        rows = re.findall(r"^ +([0-9.]+) ms +([0-9.]+) x  (\S.*)$", lines, re.M)
        if len(rows) < 3 or abs(sum(float(ms) for ms, _, _ in rows) - inside - calls) > 0.01 * (inside + calls) + 2e-3:
            fail(f"kernel times by {name} {rows} do not add up to {inside} + {calls} ms")
        if name == "kind":
            kinds = {kind: float(ms) for ms, _, kind in rows}
            # the CNN's: its ReLUs and biases, pooling, the loss, SGD
            for kind in ("element-wise", "pooling", "loss", "optimizer"):
                if not kinds.get(kind, 0) > 0:
                    fail(f"no time of kind {kind} in {kinds}")
            if gpu and not (kinds.get("convolution forward", 0) > 0 and kinds.get("GEMM", 0) > 0):
                fail(f"the GPU build timed no convolution or GEMM: {kinds}")


# With the launch count on and its kernels timed (fenced kernels: the floor stays below
# the step all the more), two epochs: the first warms up, and only the second is timed
# and counted.
out, r = ddp_bench(["train.epochs=2"], "times")
if r["world_size"] != 2 or r["steps"] != 79 or r["warmup_epochs"] != 1:  # 10000 samples, 5000 a rank, batch 64
    fail(f"ddp_bench ran {r['world_size']} ranks, {r['steps']} steps after {r['warmup_epochs']} warm-up epoch(s); "
         "expected 2, 79 and 1")
for key in ("samples_per_s", "step_ms", "floor_kernels_ms", "floor_allreduce_ms", "efficiency"):
    if not r[key] > 0:
        fail(f"ddp_bench {key} = {r[key]}")
if not r["floor_ms"] < 1.5 * r["step_ms"]:  # the floor is a part of the step, give or take noise
    fail(f"floor {r['floor_ms']} ms against a step of {r['step_ms']} ms")
# The CNN's GEMM and convolution calls per step: conv1 forward and weights (no input
# gradient for the first layer), conv2's three, and four for each linear (forward,
# weights, bias, input).
if r["library_calls_per_step"] != 13:
    fail(f"ddp_bench counted {r['library_calls_per_step']} GEMM/conv calls per step; the CNN makes 13")
if not r["kokkos_kernels_per_step"] >= 10 or not r["launches_per_step"] >= 13 + r["kokkos_kernels_per_step"]:
    fail(f"ddp_bench counted {r['kokkos_kernels_per_step']} Kokkos kernels, {r['launches_per_step']} launches per step")
positive(r"launches +([0-9.]+) per step \(rank 0\): ([0-9.]+) Kokkos kernels", out, "the launch count line")
kernel_times(out, r, device=False)
# DDP_LAUNCH_COUNT=device: the GPU build times on the device, unfenced; the CPU build
# as times does. One epoch, timed and counted without a warm-up: what is checked here
# is the count and its times, not the speed.
gpu = not r["compute"].startswith("oneDNN")
out, d = ddp_bench(["train.epochs=1"], "device")
if d["steps"] != 79 or d["library_calls_per_step"] != 13:
    fail(f"ddp_bench (DDP_LAUNCH_COUNT=device) ran {d['steps']} steps, {d['library_calls_per_step']} calls a step")
kernel_times(out, d, device=gpu)
print(f"ddp_bench: {r['samples_per_s']:.0f} samples/s, floor / actual {r['efficiency']:.2f}, {r['compute']}, "
      f"{r['launches_per_step']:.1f} launches per step")

# DDP_LAUNCH_COUNT=after (tools/bench_gpu's runs): one epoch timed uncounted, then
# one more counted: the same dispatches per step as the counted epoch above.
out, a = ddp_bench(["train.epochs=1"], "after")
if a["steps"] != 79 or a["warmup_epochs"] != 0 or not a["samples_per_s"] > 0:
    fail(f"ddp_bench (DDP_LAUNCH_COUNT=after) timed {a['steps']} steps after {a['warmup_epochs']} warm-up epochs")
for key in ("launches_per_step", "kokkos_kernels_per_step", "library_calls_per_step"):
    if a[key] != r[key]:
        fail(f"DDP_LAUNCH_COUNT=after counted {key} {a[key]}, the counted epoch above {r[key]}")
if a["kokkos_kernel_ms_per_step"] != -1 or "counted in an extra epoch after the timed ones" not in out:
    fail("DDP_LAUNCH_COUNT=after: kernel times, or no line saying where it counted")

# A language model: gpt_tiny on the small Markov shards (99,841 tokens: 1,560 windows
# of 64), its tokens/s the samples/s times 64, and its floor.
markov = ["data.train_files=e2e_data/markov_small/train_000.h5", "data.val_files=e2e_data/markov_small/val_000.h5"]
lm_out = run([mpiexec, "-n", "2", "--oversubscribe", os.path.join(build, "ddp_bench"),
              os.path.join(source, "inputs", "gpt_tiny.nml"), *markov, "train.epochs=1",
              "io.run_dir=runs/bench_tools_lm"])
lm = json.loads([l for l in lm_out.splitlines() if l.startswith("json: ")][0][6:])
if lm["steps"] != 49 or abs(lm["tokens_per_s"] - 64 * lm["samples_per_s"]) > 1e-6 * lm["tokens_per_s"] or \
        not 0 < lm["efficiency"] <= 1.5 or f"samples/s   {lm['samples_per_s']:.0f} (tokens/s {lm['tokens_per_s']:.0f})" \
        not in lm_out:
    fail(f"ddp_bench on gpt_tiny: {lm['steps']} steps (1,560 windows, 16 a rank: 49), tokens/s "
         f"{lm['tokens_per_s']} against samples/s {lm['samples_per_s']}, floor / actual {lm['efficiency']}")

if torch_python:
    # gpt_tiny's layers in PyTorch (nanoGPT's attention; SDPA, or the plain form under
    # PyTorch 1.x): ddp_train's parameter count, AdamW with clipping, and it learns
    # (below ln 16 = 2.77, where it starts, after its one epoch of 49 steps: 2.56 seen).
    out = run([torch_python, os.path.join(source, "tools", "torch_bench.py"), "-n", "2",
               os.path.join(source, "inputs", "gpt_tiny.nml"), *markov], base_env=torch_env)
    (rate, tokens, count, loss) = positive(
        r"torch_bench: .*, 2 rank\(s\), device cpu, mode eager fp32, batch 16 per rank, 49 steps, "
        r"samples/s ([0-9.]+), tokens/s ([0-9]+), .*parameters ([0-9]+), final loss ([0-9.]+)", out,
        "torch_bench's gpt_tiny line")
    lm_params = lm["params_bytes"] / 4
    if count != lm_params or abs(tokens - 64 * rate) > 0.01 * tokens + 1 or not loss < 2.7:
        fail(f"PyTorch's gpt_tiny: {count:.0f} parameters (ddp_train's {lm_params:.0f}), tokens/s {tokens} at "
             f"samples/s {rate}, final loss {loss}")
    # The ResNet's layers (batchnorm2d, resblock, globalavgpool), small: its
    # parameters as ddp_train counts them (stem conv 72, batch norm 16, resblock 8 -> 8
    # at stride 2: 576 + 16 + 576 + 16 + 64 + 16, linear 90), and it trains.
    # With --profile: 3 more steps under the profiler, their time by kind.
    out = run([torch_python, os.path.join(source, "tools", "torch_bench.py"), "--profile", "3", "-n", "2",
               os.path.join(source, "inputs", "fashion_resnet.nml"), shard,
               "model.layers=conv2d(8, 3, pad=1, bias=false), batchnorm2d, relu, resblock(8, stride=2), "
               "globalavgpool, flatten, linear(10)"], base_env=torch_env)
    (rate, count, loss) = positive(
        r"torch_bench: .*, 2 rank\(s\), device cpu, mode eager fp32, batch 64 per rank, 79 steps, "
        r"samples/s ([0-9.]+), .*parameters ([0-9]+), final loss ([0-9.]+)", out, "torch_bench's ResNet line")
    if count != 1442:
        fail(f"PyTorch's small ResNet has {count:.0f} parameters, ddp_train's 1442")
    if not loss < 1.5:
        fail(f"PyTorch's small ResNet did not train: final loss {loss}")
    m = re.search(r"torch_bench profile: 3 steps of ([0-9.]+) ms under the profiler; .* per step, ([0-9.]+) ms in "
                  r"all, by kind, longest first:\n((?: +[0-9.]+ ms +[0-9.]+ x  .*\n)+)torch_bench profile: the longest",
                  out)
    if not m or out.count("torch_bench profile: 3 steps") != 1:
        fail("no profile from rank 0 alone")
    step_ms, total = float(m.group(1)), float(m.group(2))
    kinds = {k: float(ms) for ms, _, k in re.findall(r"^ +([0-9.]+) ms +([0-9.]+) x  (.*)$", m.group(3), re.M)}
    if not (0 < total <= step_ms * 1.05 and abs(sum(kinds.values()) - total) < 0.01 * total + 0.005):
        fail(f"profile: kinds {kinds} against {total} ms in all, a step of {step_ms} ms")
    for kind in ("convolution forward", "batch norm", "element-wise", "optimizer", "GEMM"):
        if not kinds.get(kind, 0) > 0:
            fail(f"profile: no time of kind {kind} in {kinds}")
    # tools/step_split: ddp_bench's step of the same model beside that profile, by kind.
    small = ["model.layers=conv2d(8, 3, pad=1, bias=false), batchnorm2d, relu, resblock(8, stride=2), "
             "globalavgpool, flatten, linear(10)"]
    ddp_out = run([mpiexec, "-n", "2", "--oversubscribe", os.path.join(build, "ddp_bench"),
                   os.path.join(source, "inputs", "fashion_resnet.nml"), shard, *small,
                   "io.run_dir=runs/bench_tools_split"], {"DDP_LAUNCH_COUNT": "times"})
    ddp_kinds = {k: (float(ms), float(n)) for ms, n, k in re.findall(
        r"^ +([0-9.]+) ms +([0-9.]+) x  (.*)$", ddp_out.partition("  kinds ")[2].partition("  memory")[0], re.M)}
    ddp_step = json.loads([l for l in ddp_out.splitlines() if l.startswith("json: ")][0][6:])["step_ms"]
    torch_kinds = {k: (float(ms), float(n)) for ms, n, k in
                   re.findall(r"^ +([0-9.]+) ms +([0-9.]+) x  (.*)$", m.group(3), re.M)}
    os.makedirs("runs", exist_ok=True)
    with open("runs/bench_tools_split_ddp.txt", "w") as f:
        f.write(ddp_out)
    with open("runs/bench_tools_split_torch.txt", "w") as f:
        f.write(out)
    split = subprocess.run([sys.executable, os.path.join(source, "tools", "step_split"), "runs/bench_tools_split_ddp.txt",
                            "runs/bench_tools_split_torch.txt"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
    print(split.stdout)
    table = [[c.strip() for c in l.strip("|").split("|")] for l in split.stdout.splitlines() if l.startswith("| ")]
    if split.returncode != 0 or len(table) < 3 or table[0][0] != "kind":
        fail(f"step_split exited {split.returncode} with no table")
    body = {r[0]: r[1:] for r in table[2:]}
    cell = lambda v, i, f: f.format(v[i]) if v else ""
    diffs = []
    for k in set(ddp_kinds) | set(torch_kinds):
        d, t = ddp_kinds.get(k), torch_kinds.get(k)
        diff = (d[0] if d else 0) - (t[0] if t else 0)
        want = [cell(d, 0, "{:.3f}"), cell(d, 1, "{:.2f}"), cell(t, 0, "{:.3f}"), cell(t, 1, "{:.2f}")]
        if k not in body or body[k][:4] != want or abs(float(body[k][4]) - diff) > 1.5e-3:
            fail(f"step_split's row of {k}: {body.get(k)}; the outputs say {want}, {diff:+.3f}")
    got = [float(r[5]) for r in table[2:] if r[0] in ddp_kinds or r[0] in torch_kinds]
    if len(got) != len(set(ddp_kinds) | set(torch_kinds)) or got != sorted(got, reverse=True):
        fail(f"step_split's rows: {len(got)} kinds, not each once with the largest excess first: {got}")
    sums = body.get("all kinds", [])
    if not sums or abs(float(sums[0]) - sum(v[0] for v in ddp_kinds.values())) > 2e-3 or \
            abs(float(sums[2]) - sum(v[0] for v in torch_kinds.values())) > 2e-3:
        fail(f"step_split's sums {sums}")
    wall = body.get("the step (wall)", [])
    if not wall or wall[0] != f"{ddp_step:.3f}" or wall[2] != f"{step_ms:.3f}":
        fail(f"step_split's step line {wall}: ddp_bench's step {ddp_step:.3f} ms, the profile's {step_ms:.3f}")
    # Its inputs swapped: one line naming the file that is not ddp_bench's, exit 2.
    split = subprocess.run([sys.executable, os.path.join(source, "tools", "step_split"),
                            "runs/bench_tools_split_torch.txt", "runs/bench_tools_split_ddp.txt"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if split.returncode != 2 or split.stdout != ("step_split: runs/bench_tools_split_torch.txt holds no table by kind "
                                                 "of ddp_bench (run it with DDP_LAUNCH_COUNT=device or =times)\n"):
        fail(f"step_split with its inputs swapped: exit {split.returncode}, {split.stdout!r}")
    # AMP's mode (autocast bf16, channels_last), as bench_gpu runs it on a GPU, here on the CPU.
    out = run([torch_python, os.path.join(source, "tools", "torch_bench.py"), "--mode", "amp", "-n", "2",
               os.path.join(source, "inputs", "fashion_resnet.nml"), shard,
               "model.layers=conv2d(8, 3, pad=1, bias=false), batchnorm2d, relu, resblock(8, stride=2), "
               "globalavgpool, flatten, linear(10)"], base_env=torch_env)
    (loss,) = positive(r"torch_bench: .*, mode AMP bf16 channels_last, .*, 79 steps, .*final loss ([0-9.]+)", out,
                       "torch_bench's AMP line")
    if not loss < 2.0:  # from ln 10 = 2.30; bf16 on the CPU learns slower in one epoch (1.62 seen)
        fail(f"PyTorch's small ResNet under AMP did not train: final loss {loss}")
else:
    print("torch_bench: skipped (no python with torch)")
print("PASS")
