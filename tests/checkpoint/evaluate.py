#!/usr/bin/env python3
"""ddp_train --evaluate on the checkpoints of a real 3-epoch run (2 ranks, the
Fashion-MNIST MLP: the ckpt_fashion_run fixture's runs/ckpt_exact_straight):

1. its newest checkpoint (io.resume = 'auto') on 1 and 3 ranks, preloaded and
   streamed: the 'evaluation: {...}' line's val_loss, val_correct, val_correct5 and
   val_count are bitwise the run's own metrics.jsonl record of that step, and the
   reader's line says which checkpoint, epoch and step;
2. io.resume naming epoch 1's checkpoint: epoch 1's record, not the newest;
3. io.init_from with io.resume = 'never': the newest's numbers, weights alone;
4. nothing in the run directory changes (names, sizes, modification times);
5. no checkpoint (an empty run directory), no data.val_files, and a checkpoint of
   another model: one error line each, exit status 1 on every rank, no evaluation;
6. a batch-norm model trained in bf16 for an epoch on 2 ranks, evaluated on 3: its
   record, bitwise (the running statistics and the precision are the run's).

usage: evaluate.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import json
import os
import sys

from common import mpirun, run

mpiexec, binary, nml, run_dir = sys.argv[1:5]
ckpt_dir = os.path.join(run_dir, "checkpoints")
records = {r["step"]: r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))}
names = sorted(n for n in os.listdir(ckpt_dir) if n.endswith(".h5"))
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def snapshot():
    out = {}
    for root, _, files in os.walk(run_dir):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.join(root, f)] = (st.st_size, st.st_mtime_ns)
    return out


def evaluate(np_, *overrides):
    code, out, err = run(mpirun(mpiexec, np_, binary, ["--evaluate", nml, f"io.run_dir={run_dir}", *overrides]))
    said = [line[len("evaluation: "):] for line in out.splitlines() if line.startswith("evaluation: ")]
    return code, out, err, (json.loads(said[0]) if len(said) == 1 else None)


def expect_record(result, step, what):
    code, out, _, got = result
    check(code == 0 and got is not None, f"{what}: exit status 0 and one 'evaluation:' JSON line")
    if got is None:
        return
    want = records[step]
    for key in ["val_loss", "val_acc", "val_correct", "val_acc5", "val_correct5", "val_count"]:
        check(got.get(key) == want[key], f"{what}: {key} {got.get(key)!r} is the run's {want[key]!r} at step {step}")


before = snapshot()
newest = max(records)
path = os.path.join(ckpt_dir, f"ckpt_{newest:09d}.h5")
for np_, mode in [(1, "preload"), (3, "preload"), (3, "stream")]:
    result = evaluate(np_, f"data.mode={mode}")
    expect_record(result, newest, f"{np_} rank(s), {mode}")
    line = f"evaluation of {path} (epoch {records[newest]['epoch']}, step {newest}) on 10000 samples: val_loss "
    check(any(l.startswith(line) for l in result[1].splitlines()), f"{np_} rank(s), {mode}: a line '{line}...'")
    if result[3]:
        check(result[3].get("world_size") == np_ and result[3].get("checkpoint") == path,
              f"{np_} rank(s): world_size {result[3].get('world_size')}, checkpoint {result[3].get('checkpoint')}")

first = min(records)
expect_record(evaluate(2, f"io.resume={ckpt_dir}/ckpt_{first:09d}.h5"), first, "io.resume = epoch 1's checkpoint")
result = evaluate(2, "io.resume=never", f"io.init_from={path}")
expect_record(result, newest, "io.init_from, io.resume = 'never'")
check(snapshot() == before, f"{run_dir}: no file added, removed or changed by the evaluations")


def expect_error(result, words, what):
    code, out, err, got = result
    errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
    check(code == 1 and got is None, f"{what}: exit status {code} (1), no evaluation")
    check(len(errors) == 1 and words in errors[0], f"{what}: one error line with '{words}': {errors}")
    check("Traceback" not in err and "terminate called" not in err, f"{what}: no stack dump")


empty = run_dir + "_evaluate_empty"
os.makedirs(empty, exist_ok=True)
expect_error(evaluate(2, f"io.run_dir={empty}"),
             f"no checkpoint to evaluate: io.run_dir '{empty}' holds no usable checkpoint", "an empty run directory")
expect_error(evaluate(2, "data.val_files="), "data.val_files is empty", "no data.val_files")
expect_error(evaluate(2, "model.layers=flatten,linear(128),relu,linear(10)"),
             "does not fit the model: /model/layers.1.weight has shape (256,784), the model's is (128,784)",
             "a checkpoint of another model")

# A batch-norm model trained in bf16: --evaluate takes the checkpoint's running
# statistics and the run's precision, and gives its record on 3 ranks.
bn_dir = run_dir + "_evaluate_bn"
bn = ["model.layers=conv2d(8, 3, stride=2, pad=1, bias=false), batchnorm2d, relu, globalavgpool, flatten, "
      "linear(10)", "train.precision=bf16", f"io.run_dir={bn_dir}"]
code, _, _ = run(mpirun(mpiexec, 2, binary, [nml, "train.epochs=1", "io.resume=never", *bn]))
check(code == 0, "the batch-norm model trains for an epoch on 2 ranks")
records = {r["step"]: r for r in map(json.loads, open(os.path.join(bn_dir, "metrics.jsonl")))}
expect_record(evaluate(3, *bn), max(records), "batch norm, bf16, 3 ranks")

if failures:
    sys.exit(f"FAIL: {len(failures)} check(s)")
print("PASS")
