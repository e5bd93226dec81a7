#!/usr/bin/env python3
"""tools/scaling_model's arithmetic on a trace made here, and on a real one.

usage: scaling_model_test.py TOOLS_DIR WORK_DIR [REAL_TRACE.json]

A made-up 1-rank trace: steps of 10 ms whose backward ends with layer 2 at -4 ms,
layer 1 at -2 ms and layer 0 at 0 (relative to backward's end), two buckets (1 MB
holding layer 2, 2 MB holding layers 0-1), batch 8 with 2 micro-steps. Against an
alpha-beta network of alpha 0 and busbw 1 GB/s (t = n 2 (W - 1) / W / 1e9):
- W = 2: the buckets take 1 and 2 ms; overlapped, the first ends at -3 ms, the
  second at +2: the step 12 ms (exposed 2); after backward: 13 ms;
- W = 4: 1.5 and 3 ms: 13 ms overlapped, 14.5 not;
- --cores 2 at W = 4: compute and ready times twice as long: 20 ms + 3 exposed;
- --step-ms 20: every time doubled, W = 2: 22 ms overlapped;
- a measured all-reduce table, interpolated between its sizes;
- one line each: a trace without buckets, a rank count the measured table lacks.
With REAL_TRACE (a ddp_train --trace on 1 rank): the buckets are there, and the
built-in h100-ib network predicts efficiencies in (0, 1].
"""
import json
import os
import subprocess
import sys

from checks import check, finish

tools, work = sys.argv[1], sys.argv[2]
real = sys.argv[3] if len(sys.argv) > 3 else None
os.makedirs(work, exist_ok=True)


def run(*args):
    p = subprocess.run([sys.executable, os.path.join(tools, "scaling_model"), *args], capture_output=True, text=True)
    out = p.stdout + p.stderr
    rows = None
    for line in p.stdout.splitlines():
        if line.startswith("json: "):
            rows = {r["ranks"]: r for r in json.loads(line[6:])["rows"]}
    return p.returncode, out.strip(), rows


def near(a, b):
    return abs(a - b) <= 1e-6 * abs(b)


events = []
for k in range(3):  # three steps 20 ms apart, each 10 ms: forward 0-4, backward 4-10
    t0 = k * 20000.0
    events.append({"name": f"step {k + 5}", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": t0, "dur": 10000.0})
    events.append({"name": "layers.0 linear(4)", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": t0,
                   "dur": 4000.0})
    for layer, (begin, end) in {2: (4000.0, 6000.0), 1: (6000.0, 8000.0), 0: (8000.0, 10000.0)}.items():
        events.append({"name": f"layers.{layer} linear(4)", "cat": "backward", "ph": "X", "pid": 0, "tid": 0,
                       "ts": t0 + begin, "dur": end - begin})
meta = {"world_size": 1, "batch_size": 8, "accumulation_steps": 2,
        "buckets": [{"bytes": 1000000, "layers": [2, 2]}, {"bytes": 2000000, "layers": [0, 1]}]}
trace = os.path.join(work, "trace.json")
json.dump({"traceEvents": events, "otherData": meta}, open(trace, "w"))
net = os.path.join(work, "net.json")
json.dump({"name": "test", "ranks_per_node": 8, "intra": {"alpha_us": 0.0, "busbw_gbs": 1.0},
           "inter": {"alpha_us": 0.0, "busbw_gbs": 1.0}}, open(net, "w"))

rc, out, rows = run(trace, "--net", net, "--ranks", "1,2,4")
check(rc == 0 and rows is not None, f"runs ({out.splitlines()[0] if out else ''})")
if rows:
    B = 16  # 8 a micro-step, 2 micro-steps
    check(near(rows[1]["overlap"], B / 0.010), f"1 rank: {rows[1]['overlap']:.1f} samples/s = 16 / 10 ms")
    check(near(rows[2]["overlap"], 2 * B / 0.012) and near(rows[2]["no_overlap"], 2 * B / 0.013),
          f"2 ranks: {rows[2]['overlap']:.1f} and {rows[2]['no_overlap']:.1f} = 32 / 12 ms and 32 / 13 ms")
    check(near(rows[4]["overlap"], 4 * B / 0.013) and near(rows[4]["no_overlap"], 4 * B / 0.0145),
          f"4 ranks: {rows[4]['overlap']:.1f} and {rows[4]['no_overlap']:.1f} = 64 / 13 ms and 64 / 14.5 ms")
    check(near(rows[4]["ideal"], 4 * B / 0.010), "ideal: 4 x 16 / 10 ms")
rc, out, rows = run(trace, "--net", net, "--ranks", "4", "--cores", "2")
check(rc == 0 and rows and near(rows[4]["overlap"], 4 * 16 / 0.023),
      "--cores 2 on 4 ranks: 20 ms of compute + 3 exposed")
rc, out, rows = run(trace, "--net", net, "--ranks", "2", "--step-ms", "20")
check(rc == 0 and rows and near(rows[2]["overlap"], 2 * 16 / 0.022), "--step-ms 20: 20 ms + 2 exposed")

# A measured table: 1 MB in 1 ms, 4 MB in 2.5 ms on 2 ranks: 2 MB interpolates to 1.5 ms.
bench = os.path.join(work, "allreduce_2.txt")
open(bench, "w").write('allreduce_json: {"world_size": 2, "alpha_us": 1.0, "busbw_gbs": 1.0, '
                       '"bytes": [1000000, 4000000], "seconds": [0.001, 0.0025]}\n')
rc, out, rows = run(trace, "--allreduce", bench, "--ranks", "1,2", "--measured", "2=2500")
# first bucket ends -4 + 1 = -3, the second 0 + 1.5: exposed 1.5 ms
check(rc == 0 and rows and near(rows[2]["overlap"], 2 * 16 / 0.0115) and rows[2]["measured"] == 2500.0,
      "measured all-reduce interpolated (2 MB: 1.5 ms), measured samples/s beside")
rc, out, _ = run(trace, "--allreduce", bench, "--ranks", "3")
check(rc != 0 and len(out.splitlines()) == 1 and "no measured all-reduce on 3 ranks" in out,
      f"a rank count the table lacks: {out}")
bare = os.path.join(work, "bare.json")
json.dump({"traceEvents": events, "otherData": {"world_size": 1, "batch_size": 8}}, open(bare, "w"))
rc, out, _ = run(bare, "--net", "h100-ib")
check(rc != 0 and len(out.splitlines()) == 1 and "no gradient buckets in otherData" in out,
      f"a trace without buckets: {out}")

if real:
    rc, out, rows = run(real, "--net", "h100-ib", "--ranks", "8,64,512")
    meta = json.load(open(real))["otherData"]
    check(len(meta.get("buckets", [])) >= 1 and all(b["bytes"] > 0 for b in meta["buckets"]),
          f"ddp_train's trace holds its buckets ({meta.get('buckets')})")
    check(rc == 0 and rows and all(0 < r["overlap"] / r["ideal"] <= 1 and r["no_overlap"] <= r["overlap"]
                                   for r in rows.values()),
          f"h100-ib on a real trace: efficiencies in (0, 1], overlap no slower ({out.splitlines()[0]})")

finish("scaling_model_test")
