#!/usr/bin/env python3
"""train.cuda_graph (GPU build): a run whose steps replay a CUDA graph ends bitwise
where the same run without graphs ends.

Each model given trains 2 epochs on 2 ranks with train.cuda_graph = 'off' and 'on',
from the same seed: the final checkpoints' /model and /optimizer datasets must be
bitwise identical, and so must the validation metrics. The graph run must say, for
each epoch, that most of its micro-batches ran from a graph (all but the first
sightings of each (slot, batch size) and their captures: at most 8 an epoch), so
the comparison is not between two uncaptured runs.

usage: graph_equal.py MPIEXEC DDP_TRAIN RUN_PREFIX INPUT.nml [INPUT.nml ...] [-- group.key=value ...]
"""
import json
import os
import re
import shutil
import sys

from common import arrays, bitwise_equal, fail, latest, mpirun, run

mpiexec, binary, prefix = sys.argv[1:4]
rest = sys.argv[4:]
inputs, overrides = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])

for nml in inputs:
    name = os.path.splitext(os.path.basename(nml))[0]
    dirs = {}
    for setting in ("off", "on"):
        run_dir = f"{prefix}_{name}_{setting}"
        shutil.rmtree(run_dir, ignore_errors=True)
        rc, out, err = run(mpirun(mpiexec, 2, binary, [nml, "train.epochs=2", f"train.cuda_graph={setting}",
                                                       f"io.run_dir={run_dir}"] + overrides))
        if rc != 0:
            fail(f"{name}: train.cuda_graph = '{setting}' exited {rc}")
        dirs[setting] = run_dir
        if setting == "on":
            if not re.search(r"^CUDA graph: forward, loss and backward", out, re.M):
                fail(f"{name}: no 'CUDA graph: forward, loss and backward ...' line at start-up")
            counts = [(int(a), int(b)) for a, b in
                      re.findall(r"^CUDA graph: (\d+) of (\d+) micro-batches of epoch \d+ ran from a graph", out, re.M)]
            print(f"{name}: micro-batches (from a graph, in all) per epoch: {counts}")
            if len(counts) != 2 or any(total - replayed > 8 or replayed == 0 for replayed, total in counts):
                fail(f"{name}: expected 2 epochs with all but at most 8 micro-batches from a graph")
    a = os.path.join(dirs["off"], "checkpoints", latest(dirs["off"]))
    b = os.path.join(dirs["on"], "checkpoints", latest(dirs["on"]))
    same, report = bitwise_equal(arrays(a), arrays(b))
    print(f"{name}: final checkpoints {a} vs {b}: {report}")
    if not same:
        fail(f"{name}: parameters or optimizer state differ between the runs without and with a CUDA graph")
    ma = [json.loads(l) for l in open(os.path.join(dirs["off"], "metrics.jsonl"))]
    mb = [json.loads(l) for l in open(os.path.join(dirs["on"], "metrics.jsonl"))]
    keys = ("val_loss", "val_correct", "train_loss")
    if [[m[k] for k in keys] for m in ma] != [[m[k] for k in keys] for m in mb]:
        fail(f"{name}: metrics differ: {[[m[k] for k in keys] for m in ma]} vs {[[m[k] for k in keys] for m in mb]}")
    print(f"PASS {name}: 2 epochs with and without a CUDA graph end bitwise equal "
          f"(val_acc {mb[-1]['val_acc']})")
