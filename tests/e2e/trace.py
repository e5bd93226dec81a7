#!/usr/bin/env python3
"""io.trace: per-rank Chrome-trace timelines, merged by tools/merge_traces.

usage: trace.py MPIEXEC DDP_TRAIN MERGE_TRACES TINY.nml CNN.nml RUN_PREFIX [--gpu-build]

1. The Fashion-MNIST CNN (1024 training samples, no validation) on 2 ranks with
   --trace, io.trace_steps = 3, 6, comm.overlap = 'poll' through MPI
   (comm.shared_memory = F) and the default buckets
   (a 1 MB first bucket, so the CNN's 0.4 M parameters make two):
   - each rank's file parses, names its process "rank N (host)" under pid N, and
     covers exactly steps 3-6 ("step N" spans);
   - on every row the spans nest: each one lies inside the one that is open when it
     starts, or starts after it ends;
   - every step holds forward (one span per layer, in order), loss, backward
     (layers in reverse order), data wait (the next batch's, once the step is
     queued), the all-reduce wait, step checks, optimizer, and nothing else
     (zero_grad writes nothing: no span); an epoch's first step also its first
     batch's data wait, before forward;
   - every bucket has its own row and one all-reduce span per step; in every step
     the first bucket's all-reduce starts inside backward and a later layer's
     backward starts while it is in flight (the overlap), while the last bucket,
     reduced blocking in finish(), starts after backward;
   - merge_traces makes one file with a process per rank, all spans kept.
2. The tiny MLP with comm.overlap = 'none': no bucket rows, and each step's one
   all-reduce starts after its backward ends (the check of 1 can tell the two apart).
3. The tiny MLP with comm.overlap = 'thread' (through MPI) and a bucket per
   tensor: each bucket's all-reduce, run by the communication thread, has its row.
3b. The tiny MLP through shared memory (the default on one node), a bucket per
   tensor: the run says so, and each bucket's row has one span per step, inside
   the step's all-reduce wait, after backward.
4. A window past the run's end (steps 8-100 of a 10-step run): the files are
   written when the run ends, with steps 8-10, and the run says so.
5. Without io.trace: no trace directory.
The GPU build (--gpu-build) with its ranks on one GPU reduces through MPI staged in
host memory, without buckets, as the run says: there 1 expects no bucket rows and
the step's one all-reduce after backward, 3 does not apply, and 3b never does
(gradients in device memory). The CPU build must bucket.
"""
import json
import os
import re
import shutil
import subprocess
import sys

EPS = 1e-6  # microseconds; the files hold integer nanoseconds


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def run(args, run_dir, *extra):
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [args.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", args.ddp_train, *extra,
           f"io.run_dir={run_dir}"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240)
    lines = [l for l in p.stdout.splitlines() if l.startswith(("trace:", "gradients:", "epoch "))]
    print(f"$ {' '.join(cmd)}\n" + "\n".join(lines) + f"\n--- exit {p.returncode}")
    if p.returncode != 0:
        print(p.stdout[-3000:] + p.stderr[-3000:])
        fail(f"ddp_train exited {p.returncode}")
    return p.stdout


def load(run_dir, rank):
    path = os.path.join(run_dir, "trace", f"rank{rank}.json")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    return path, doc


def spans(doc, tid=None):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (tid is None or e["tid"] == tid)]


def end(e):
    return e["ts"] + e["dur"]


def inside(child, parent):
    return child["ts"] >= parent["ts"] - EPS and end(child) <= end(parent) + EPS


def check_nesting(path, doc):
    rows = {}
    for e in spans(doc):
        rows.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, es in rows.items():
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in es:
            while stack and e["ts"] >= end(stack[-1]) - EPS:
                stack.pop()
            if stack and not inside(e, stack[-1]):
                fail(f"{path} row {key}: '{e['name']}' at {e['ts']} ({e['dur']} us) overlaps "
                     f"'{stack[-1]['name']}' at {stack[-1]['ts']} ({stack[-1]['dur']} us) without nesting")
            stack.append(e)
    return rows


def row_names(doc):
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def steps_of(doc):
    out = {}
    for e in spans(doc, 0):
        m = re.fullmatch(r"step (\d+)", e["name"])
        if m:
            out[int(m.group(1))] = e
    return out


def children(doc, parent, tid=0):
    """Spans of row tid directly or indirectly inside parent, in time order."""
    return sorted((e for e in spans(doc, tid) if e is not parent and inside(e, parent)), key=lambda e: e["ts"])


def check_common(path, doc, rank, first, last):
    if doc.get("otherData", {}).get("rank") != rank:
        fail(f"{path}: otherData.rank is {doc.get('otherData', {}).get('rank')}, expected {rank}")
    procs = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    if len(procs) != 1 or not re.fullmatch(rf"rank {rank} \(.+\)", procs[0]["args"]["name"]) or procs[0]["pid"] != rank:
        fail(f"{path}: process_name {procs}, expected one 'rank {rank} (host)' under pid {rank}")
    if any(e["pid"] != rank for e in doc["traceEvents"]):
        fail(f"{path}: events of another pid than {rank}")
    check_nesting(path, doc)
    steps = steps_of(doc)
    if sorted(steps) != list(range(first, last + 1)):
        fail(f"{path}: step spans {sorted(steps)}, expected {first}-{last}")
    return steps


def subset_shard(path, n):
    """The first n samples of Fashion-MNIST's first training shard: 8 steps of 64 per rank."""
    import h5py
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with h5py.File("data/fashion-mnist/train_000.h5", "r") as src, h5py.File(path, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        dst.create_dataset("x", data=src["x"][:n])
        dst.create_dataset("y", data=src["y"][:n])


def check_cnn(args, layers):
    run_dir = args.prefix + "_cnn"
    shard = args.prefix + "_cnn_train.h5"
    subset_shard(shard, 1024)
    out = run(args, run_dir, args.cnn, "--trace", "io.trace_steps=3,6", "comm.overlap=poll",
              "comm.shared_memory=F", f"data.train_files={shard}", "data.val_files=", "train.epochs=1",
              "io.checkpoint_every=0")
    # The GPU build's ranks sharing one GPU go through MPI staged in host memory: one
    # all-reduce after backward, no buckets (the run says so). The CPU build must bucket.
    bucketless = no_buckets(out)
    if bucketless and not args.gpu_build:
        fail("the CNN's gradients are not reduced in buckets")
    trained = [i for i, l in enumerate(layers) if l.startswith(("conv2d", "linear"))]
    first_trained = trained[0]
    for rank in (0, 1):
        path, doc = load(run_dir, rank)
        steps = check_common(path, doc, rank, 3, 6)
        names = row_names(doc)
        buckets = sorted(t for t in names if t >= 100)
        if bucketless and buckets:
            fail(f"{path}: bucket rows {[names[t] for t in buckets]} of a run without buckets")
        if not bucketless and len(buckets) < 2:
            fail(f"{path}: bucket rows {[names[t] for t in buckets]}, expected at least 2 (1 MB first bucket)")
        for t in buckets:
            if not re.fullmatch(rf"all-reduce bucket {t - 100}: layers\.\S+ \([\d.]+ (B|KB|MB)\)", names[t]):
                fail(f"{path}: row {t} is named '{names[t]}'")
        for n, step in sorted(steps.items()):
            inner = children(doc, step)
            top = [e["name"] for e in inner if not e["name"].startswith("layers.")]
            # The next batch is read once the step is queued: after the all-reduce that
            # runs in the step (no buckets), before the wait for the buckets' one.
            after = ["all-reduce", "data wait"] if bucketless else ["data wait", "all-reduce wait"]
            want = ["forward", "loss", "backward"] + after + ["step checks", "optimizer"]
            if top != want and top != ["data wait"] + want:  # an epoch's first step waits for its first batch
                fail(f"{path}: step {n} holds {top}, expected {want} (after a data wait in an epoch's first step)")
            fwd = next(e for e in inner if e["name"] == "forward")
            bwd = next(e for e in inner if e["name"] == "backward")
            f_layers = [e["name"] for e in children(doc, fwd)]
            b_layers = [e["name"] for e in children(doc, bwd)]
            want_f = [f"layers.{i} {l}" for i, l in enumerate(layers)]
            want_b = [f"layers.{i} {layers[i]}" for i in reversed(range(first_trained, len(layers)))]
            if f_layers != want_f:
                fail(f"{path}: step {n}'s forward holds {f_layers}, expected {want_f}")
            if b_layers != want_b:
                fail(f"{path}: step {n}'s backward holds {b_layers}, expected {want_b}")
            if bucketless:
                ar = one_allreduce_after_backward(path, n, inner)
                if n == 3:
                    print(f"{path}: step 3: no buckets; backward {bwd['dur']:.0f} us, then the all-reduce "
                          f"{ar['dur']:.0f} us")
                continue
            ar = {t: [e for e in spans(doc, t) if inside(e, step)] for t in buckets}
            if any(len(v) != 1 for v in ar.values()):
                fail(f"{path}: step {n}: all-reduce spans per bucket {[len(v) for v in ar.values()]}, expected 1 each")
            b0 = ar[buckets[0]][0]
            later = [e for e in children(doc, bwd) if e["ts"] > b0["ts"]]
            if not (bwd["ts"] < b0["ts"] < end(bwd)) or not later:
                fail(f"{path}: step {n}: bucket 0's all-reduce [{b0['ts']}, {end(b0)}] does not overlap backward "
                     f"[{bwd['ts']}, {end(bwd)}] (no layer's backward starts while it is in flight)")
            last = ar[buckets[-1]][0]
            if last["ts"] < end(bwd) - EPS:
                fail(f"{path}: step {n}: the last bucket (reduced in finish()) starts inside backward")
            if n == 3:
                print(f"{path}: step 3: backward {bwd['dur']:.0f} us; bucket 0 ({names[buckets[0]]}) in flight "
                      f"from {b0['ts'] - bwd['ts']:.0f} us into backward for {b0['dur']:.0f} us, during "
                      f"{len(later)} later layers' backward; the last bucket {last['dur']:.0f} us after it")
    merged = os.path.join(run_dir, "merged.json")
    p = subprocess.run([sys.executable, args.merge, os.path.join(run_dir, "trace"), "-o", merged],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout.strip())
    if p.returncode != 0:
        fail(f"merge_traces exited {p.returncode}")
    with open(merged) as f:
        m = json.load(f)
    procs = sorted((e["pid"], e["args"]["name"]) for e in m["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name")
    if [pid for pid, _ in procs] != [0, 1]:
        fail(f"merged: processes {procs}, expected ranks 0 and 1")
    n_in = sum(len(spans(load(run_dir, r)[1])) for r in (0, 1))
    if len(spans(m)) != n_in:
        fail(f"merged: {len(spans(m))} spans, the rank files hold {n_in}")
    check_nesting(merged, m)
    print(f"merged: {procs}, {n_in} spans")


def check_none(args):
    run_dir = args.prefix + "_none"
    run(args, run_dir, args.tiny, "--trace", "io.trace_steps=2,4", "comm.overlap=none")
    for rank in (0, 1):
        path, doc = load(run_dir, rank)
        steps = check_common(path, doc, rank, 2, 4)
        if any(t >= 100 for t in row_names(doc)):
            fail(f"{path}: bucket rows with comm.overlap = 'none'")
        for n, step in steps.items():
            one_allreduce_after_backward(path, n, children(doc, step))


def one_allreduce_after_backward(path, n, inner):
    """A step without buckets: its one all-reduce span (returned) starts after backward ends."""
    bwd = next(e for e in inner if e["name"] == "backward")
    ar = [e for e in inner if e["name"] == "all-reduce"]
    if len(ar) != 1 or ar[0]["ts"] < end(bwd) - EPS:
        fail(f"{path}: step {n}: expected one all-reduce after backward, got {ar}")
    return ar[0]


def no_buckets(out):
    """Whether the run reduced without buckets: its start-up names none ('gradients: N
    bucket(s) ...'; the GPU build staging MPI says '(this backend has no buckets)')."""
    return not re.search(r"^gradients: \d+ bucket\(s\)", out, re.M)


def check_thread(args):
    run_dir = args.prefix + "_thread"
    out = run(args, run_dir, args.tiny, "--trace", "io.trace_steps=2,4", "comm.overlap=thread",
              "comm.shared_memory=F", "comm.first_bucket_mb=1e-5", "comm.bucket_mb=1e-5")
    if no_buckets(out) and args.gpu_build:
        print("3. not here: this GPU run reduces without buckets (MPI staged in host memory)")
        return
    for rank in (0, 1):
        path, doc = load(run_dir, rank)
        steps = check_common(path, doc, rank, 2, 4)
        buckets = sorted(t for t in row_names(doc) if t >= 100)
        if len(buckets) != 4:  # a bucket per tensor: 2 weights, 2 biases
            fail(f"{path}: {len(buckets)} bucket rows, expected 4")
        for t in buckets:
            got = [n for n, s in steps.items() if any(inside(e, s) for e in spans(doc, t))]
            if sorted(got) != sorted(steps):
                fail(f"{path}: bucket row {t} has all-reduce spans in steps {got}, expected {sorted(steps)}")


def check_shm(args):
    if args.gpu_build:
        print("3b. not here: the GPU build's gradients are in device memory (no shared-memory window)")
        return
    run_dir = args.prefix + "_shm"
    out = run(args, run_dir, args.tiny, "--trace", "io.trace_steps=2,4", "comm.first_bucket_mb=1e-5",
              "comm.bucket_mb=1e-5")
    if "gradients: 4 bucket(s)" not in out or "summed in a shared-memory window after backward (2 ranks" not in out:
        fail("no line saying the 4 buckets are summed in a shared-memory window")
    for rank in (0, 1):
        path, doc = load(run_dir, rank)
        steps = check_common(path, doc, rank, 2, 4)
        buckets = sorted(t for t in row_names(doc) if t >= 100)
        if len(buckets) != 4:
            fail(f"{path}: {len(buckets)} bucket rows, expected 4")
        for n, step in steps.items():
            inner = children(doc, step)
            bwd = next(e for e in inner if e["name"] == "backward")
            wait = next(e for e in inner if e["name"] == "all-reduce wait")
            for t in buckets:
                ar = [e for e in spans(doc, t) if inside(e, step)]
                if len(ar) != 1 or not inside(ar[0], wait) or ar[0]["ts"] < end(bwd) - EPS:
                    fail(f"{path}: step {n}: bucket row {t}: {ar}, expected one span inside the all-reduce wait "
                         f"[{wait['ts']}, {end(wait)}], after backward")


def check_cut_short(args):
    run_dir = args.prefix + "_cut"
    out = run(args, run_dir, args.tiny, "--trace", "io.trace_steps=8,100")
    if "trace: the run ended inside io.trace_steps; steps 8-10" not in out:
        fail("no line saying the run ended inside io.trace_steps (steps 8-10)")
    for rank in (0, 1):
        path, doc = load(run_dir, rank)
        check_common(path, doc, rank, 8, 10)


def check_off(args):
    run_dir = args.prefix + "_off"
    run(args, run_dir, args.tiny)
    if os.path.exists(os.path.join(run_dir, "trace")):
        fail("a trace directory without io.trace")


def main():
    import argparse
    ap = argparse.ArgumentParser()
    for a in ("mpiexec", "ddp_train", "merge", "tiny", "cnn", "prefix"):
        ap.add_argument(a)
    ap.add_argument("--gpu-build", action="store_true", help="ddp_train is the GPU build")
    args = ap.parse_args()
    layers = None
    with open(args.cnn) as f:
        text = f.read()
    m = re.search(r"layers\s*=\s*(.*?)\n/", text, re.S)
    layers = [re.sub(r"\s+", " ", s) for s in re.findall(r"'([^']*)'", m.group(1))]
    check_cnn(args, layers)
    check_none(args)
    check_thread(args)
    check_shm(args)
    check_cut_short(args)
    check_off(args)
    print("PASS")


if __name__ == "__main__":
    main()
