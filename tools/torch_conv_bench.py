#!/usr/bin/env python3
"""PyTorch's side of build/cudnn_conv_bench: ResNet-50's 23 convolution shapes (53
convolutions) at batch B, bf16 channels-last, each direction timed alone (forward
F.conv2d; backward data and backward filter through aten.convolution_backward with
one output asked for each), the median of R rounds after 2 warm-up calls, CUDA
events on the current stream. cuDNN's heuristics unless --benchmark
(torch.backends.cudnn.benchmark); nondeterministic algorithms allowed, as PyTorch's
default is.

usage: tools/torch_conv_bench.py [--batch 256] [--rounds 10] [--benchmark] [--device cuda|cpu]
                                 [--ddp CONV_BENCH_OUTPUT]

With --ddp, the lines of build/cudnn_conv_bench's output (run on the same GPU) are put
beside PyTorch's, shape by shape: ddp_train's legacy and graph API against PyTorch
(ratios > 1: ddp_train slower), and the totals over the step's 53 convolutions (the
stem's backward data left out, as there). --device cpu runs the same on the CPU in
fp32 (checks this script, not a measurement).
"""
import argparse
import re
import statistics
import sys
import time

import torch

# torchvision's resnet50 (v1.5) at 224x224: (C, H=W, K, kernel, stride, count), the
# order and counts of cudnn_conv_bench.cpp's resnet50_shapes.
SHAPES = [
    (3, 224, 64, 7, 2, 1),
    (64, 56, 64, 1, 1, 1), (64, 56, 64, 3, 1, 3), (64, 56, 256, 1, 1, 4), (256, 56, 64, 1, 1, 2),
    (256, 56, 128, 1, 1, 1), (128, 56, 128, 3, 2, 1), (128, 28, 512, 1, 1, 4), (256, 56, 512, 1, 2, 1),
    (512, 28, 128, 1, 1, 3), (128, 28, 128, 3, 1, 3),
    (512, 28, 256, 1, 1, 1), (256, 28, 256, 3, 2, 1), (256, 14, 1024, 1, 1, 6), (512, 28, 1024, 1, 2, 1),
    (1024, 14, 256, 1, 1, 5), (256, 14, 256, 3, 1, 5),
    (1024, 14, 512, 1, 1, 1), (512, 14, 512, 3, 2, 1), (512, 7, 2048, 1, 1, 3), (1024, 14, 2048, 1, 2, 1),
    (2048, 7, 512, 1, 1, 2), (512, 7, 512, 3, 1, 2),
]
assert sum(s[-1] for s in SHAPES) == 53


def shape_name(n, c, hw, k, r, stride):
    return f"N{n} C{c} {hw}x{hw} K{k} {r}x{r}/{stride}"


def median_ms(call, rounds, cuda):
    call()
    call()
    times = []
    for _ in range(rounds):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_times(batch, rounds, device):
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = {}
    for c, hw, k, r, stride, count in SHAPES:
        pad = r // 2
        x = torch.full((batch, c, hw, hw), 0.0115, device=device, dtype=dtype).to(memory_format=torch.channels_last)
        w = torch.full((k, c, r, r), 0.0115, device=device, dtype=dtype).to(memory_format=torch.channels_last)
        y = torch.nn.functional.conv2d(x, w, None, stride, pad)
        dy = torch.full_like(y, 0.0115)

        def backward(mask):
            return torch.ops.aten.convolution_backward(dy, x, w, None, [stride, stride], [pad, pad], [1, 1], False,
                                                       [0, 0], 1, mask)

        t = (median_ms(lambda: torch.nn.functional.conv2d(x, w, None, stride, pad), rounds, cuda),
             median_ms(lambda: backward([True, False, False]), rounds, cuda),
             median_ms(lambda: backward([False, True, False]), rounds, cuda))
        rows[shape_name(batch, c, hw, k, r, stride)] = (count, c, t)
    return rows


def read_ddp(path):
    """cudnn_conv_bench's lines: shape -> ((legacy fwd, data, filter), (graph fwd, data, filter))."""
    rows = {}
    pattern = re.compile(r"^conv_bench: (N\d+ C\d+ \d+x\d+ K\d+ \d+x\d+/\d+)\s+(\d+) \|" + r"\s+([0-9.]+)" * 3 +
                         r" \|" + r"\s+([0-9.]+)" * 3 + r" \|")
    with open(path) as f:
        for line in f:
            m = pattern.match(line)
            if m:
                v = [float(g) for g in m.groups()[2:]]
                rows[m.group(1)] = (tuple(v[:3]), tuple(v[3:]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--benchmark", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ddp", help="build/cudnn_conv_bench's output on the same GPU")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_conv_bench: PyTorch sees no CUDA device")
    torch.backends.cudnn.benchmark = a.benchmark
    where = torch.cuda.get_device_name() if a.device == "cuda" else "CPU (fp32: a check of this script)"
    print(f"torch_conv_bench: ResNet-50's convolutions, batch {a.batch}, "
          f"{'bf16' if a.device == 'cuda' else 'fp32'} channels-last, {where}, PyTorch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, {'cudnn.benchmark' if a.benchmark else 'heuristics'}; "
          f"the median of {a.rounds} rounds, ms")
    rows = torch_times(a.batch, a.rounds, a.device)
    ddp = read_ddp(a.ddp) if a.ddp else {}
    if a.ddp and not ddp:
        sys.exit(f"torch_conv_bench: no conv_bench lines in {a.ddp}")
    head = "| shape | count | PyTorch fwd | data | filter |"
    if ddp:
        head += " legacy / PyTorch fwd | data | filter | graph API / PyTorch fwd | data | filter |"
    print()
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    totals = [0.0, 0.0, 0.0]  # PyTorch, legacy, graph over the step
    for name, (count, c, t) in rows.items():
        step = lambda v: count * (v[0] + (0.0 if c == 3 else v[1]) + v[2])  # noqa: E731
        totals[0] += step(t)
        cells = [name, str(count)] + [f"{v:.3f}" for v in t]
        if ddp:
            if name not in ddp:
                sys.exit(f"torch_conv_bench: {a.ddp} has no line for {name} (another batch?)")
            legacy, graph = ddp[name]
            totals[1] += step(legacy)
            totals[2] += step(graph)
            cells += [f"{l / p:.2f}" for l, p in zip(legacy, t)] + [f"{g / p:.2f}" for g, p in zip(graph, t)]
        print("| " + " | ".join(cells) + " |")
    print()
    line = f"PyTorch: the step's 53 convolutions {totals[0]:.2f} ms (the stem's backward data left out)"
    if ddp:
        line += (f"; ddp_train legacy API {totals[1]:.2f} ms ({totals[1] / totals[0]:.2f}x), "
                 f"graph API {totals[2]:.2f} ms ({totals[2] / totals[0]:.2f}x)")
    print(line)


if __name__ == "__main__":
    main()
