#!/usr/bin/env python3
"""io.keep_best on real runs (2 ranks, the tiny set at lr 0.5, whose validation is
best at epoch 2 of 6 and worse after it):

1. keep_best = 'val_loss' with io.keep_checkpoints = 1 and a checkpoint every 7
   steps (none by epoch): checkpoints/best.h5 is a link to the checkpoint of the
   lowest val_loss in metrics.jsonl (the first such epoch), which keep-1 did not
   remove; that checkpoint's /state/best_val_loss is the record's val_loss bitwise
   and /state/best_step its step; epoch 1's checkpoint was made though no cadence
   asked for it (a new best is checkpointed); a 'best:' line for each new best
   and no other; every kept checkpoint's /state/best_* is the best of the records
   up to its step (the mid-epoch one too); every metrics.jsonl record carries the
   best so far (best_val_loss, best_epoch);
2. the same run in two parts (3 epochs, then resumed to 6): the same best.h5,
   /state and 'best:' lines (the record crosses the resume; epochs 4 to 6 beat
   nothing); resumed from a checkpoint older than the one best.h5 names, the link
   names that checkpoint's best again, and resumed mid-epoch the next epoch is
   compared with that record; resumed from another directory's
   checkpoint, the best is chosen again (this directory does not hold it), as
   ddp_train --check says before it;
3. ddp_train --evaluate with io.resume = .../best.h5 on 3 ranks: the best record's
   val_loss and val_correct, bitwise;
4. keep_best = 'val_acc' with io.checkpoint_async: best.h5 names epoch 2's
   checkpoint, not epoch 4's of the same val_acc (a tie keeps the earlier);
   metrics.jsonl carries best_val_acc, not best_val_loss;
5. resumed with keep_best = 'val_acc' from a 'val_loss' checkpoint: one line says
   the best is chosen again (--check says it too), and the next epoch is the best;
6. train.patience = 2 (early stopping) of 10 epochs: the run ends 0 after epoch 4,
   two epochs past the best, with a line, its last checkpoint written and
   /state/best_epoch 2; started again, nothing to train, with a line, and --check
   says so; with patience 3 --check says it would resume, naming the best, and the
   run trains epoch 5 alone; --check of the complete run: nothing to train; with
   train.min_delta = 0.4, epoch 2's gain (0.32) does not count: the run stops after
   epoch 3 (patience counted from epoch 1), best.h5 still epoch 2's, straight and
   in two parts (the reference crosses the resume), and resumed from a checkpoint
   without /state/patience_* (as written before min_delta) it counts from the best,
   epoch 2; val_acc with 0.25 alike;
7. io.keep_best without data.val_files, 'val_acc5' on a model of 3 classes,
   'val_acc' with the mse loss, train.patience without io.keep_best,
   train.min_delta without train.patience: one error line each, exit 1 on every
   rank;
8. a file, then a directory, at checkpoints/best.h5: one error line at start-up,
   from a run and from --check, nothing trained, the file left as it was.

usage: best.py MPIEXEC DDP_TRAIN TINY.nml REGRESSION.nml RUN_DIR
"""
import json
import os
import re
import shutil
import sys

import h5py

from common import checkpoints, expect_one_error, latest, mpirun, rewrite_checksum, run, state

mpiexec, binary, nml, regression_nml, run_dir = sys.argv[1:6]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def train(directory, *overrides, fresh=True):
    """6 epochs on 2 ranks (a later override wins); `fresh`: in an empty directory."""
    if fresh:
        shutil.rmtree(directory, ignore_errors=True)
    args = [nml, "train.lr=0.5", "train.log_every=0", f"io.run_dir={directory}", "train.epochs=6", *overrides]
    return run(mpirun(mpiexec, 2, binary, args), timeout=300)


def records(directory):
    return [json.loads(line) for line in open(os.path.join(directory, "metrics.jsonl"))]


def best_of(recs, key, lower, upto=None):
    """The first record of the best `key` among those of step <= upto."""
    best = None
    for r in recs:
        if upto is not None and r["step"] > upto:
            break
        if best is None or (r[key] < best[key] if lower else r[key] > best[key]):
            best = r
    return best


def link(directory):
    path = os.path.join(directory, "checkpoints", "best.h5")
    return os.readlink(path) if os.path.islink(path) else None


def best_state(directory):
    """/state of the checkpoint best.h5 names; {} where there is none."""
    path = os.path.join(directory, "checkpoints", "best.h5")
    return state(path) if os.path.exists(path) else {}


def check_line(directory, *overrides):
    """ddp_train --check's 'checkpoint:' line for train()'s arguments."""
    args = ["--check", nml, "train.lr=0.5", "train.log_every=0", f"io.run_dir={directory}", "train.epochs=6",
            *overrides]
    code, out, _ = run(mpirun(mpiexec, 2, binary, args), timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("checkpoint: ")]
    return lines[0] if code == 0 and len(lines) == 1 else f"exit {code}, lines {lines}"


def best_lines(out):
    return [line for line in out.splitlines() if line.startswith("best: ")]


# 1. val_loss, keep 1, a checkpoint every 7 steps and none by epoch.
loss_args = ["io.keep_best=val_loss", "io.keep_checkpoints=1", "io.checkpoint_every=0",
             "io.checkpoint_every_steps=7"]
straight = run_dir + "_straight"
code, out, _ = train(straight, *loss_args)
check(code == 0, "the straight run of 6 epochs ends 0")
recs = records(straight)
best = best_of(recs, "val_loss", lower=True)
name = f"ckpt_{best['step']:09d}.h5"
newest = checkpoints(straight)[-1]
print(f"best val_loss {best['val_loss']!r} at epoch {best['epoch']} step {best['step']}; newest {newest}")
check(best["step"] < recs[-1]["step"] and best["step"] % 7 != 0,
      "the fixture's best is neither the last epoch nor a step of the 7-step cadence (else this proves little)")
check(link(straight) == name, f"best.h5 links to {link(straight)} ({name})")
check(checkpoints(straight) == sorted({name, newest}) and newest == f"ckpt_{recs[-1]['step']:09d}.h5",
      f"keep 1 left the newest and the best: {checkpoints(straight)}")
st = best_state(straight)
check(st.get("best_val_loss") == best["val_loss"] and st.get("best_step") == best["step"],
      f"best.h5's /state/best_val_loss {st.get('best_val_loss')!r} and best_step {st.get('best_step')} are the record's")
news = [r for i, r in enumerate(recs) if r is best_of(recs[:i + 1], "val_loss", lower=True)]
want_lines = [f"best: val_loss {r['val_loss']:.4f} at epoch {r['epoch']} is the best so far; "
              f"{straight}/checkpoints/best.h5 names ckpt_{r['step']:09d}.h5" for r in news]
check(best_lines(out) == want_lines, f"a 'best:' line for each new best ({len(want_lines)}): {best_lines(out)}")
check(news[0]["epoch"] == 1 and news[0]["step"] % 7 != 0, "epoch 1 was a new best off the cadence")
so_far = [(best_of(recs[:i + 1], "val_loss", lower=True)["val_loss"],
           best_of(recs[:i + 1], "val_loss", lower=True)["epoch"]) for i in range(len(recs))]
check([(r.get("best_val_loss"), r.get("best_epoch")) for r in recs] == so_far,
      f"metrics.jsonl's best_val_loss and best_epoch are the best so far in every record: {so_far}")

# Every checkpoint of a run that keeps them all: /state's best is the best up to its step.
every = run_dir + "_every"
code, _, _ = train(every, *loss_args, "io.keep_checkpoints=100")
kept = checkpoints(every)
check(code == 0 and any(int(n[5:14]) % 5 != 0 for n in kept), f"a run keeping all: {kept} (mid-epoch ones among them)")
check(f"ckpt_{news[0]['step']:09d}.h5" in kept, f"epoch {news[0]['epoch']}'s best was checkpointed off the cadence")
for n in kept:
    st = state(os.path.join(every, "checkpoints", n))
    b = best_of(records(every), "val_loss", lower=True, upto=st["step"])
    check(st.get("best_val_loss") == b["val_loss"] and st.get("best_step") == b["step"],
          f"{n}: /state best_val_loss {st.get('best_val_loss')!r} at {st.get('best_step')}, the records' best so far")

# 2. In two parts: the record crosses the resume.
parts = run_dir + "_parts"
code1, out1, _ = train(parts, *loss_args, "train.epochs=3")
code2, out2, _ = train(parts, *loss_args, fresh=False)
check(code1 == 0 and code2 == 0 and "resumed from" in out2, "3 epochs, then resumed to 6")
check(link(parts) == name and checkpoints(parts) == checkpoints(straight),
      f"best.h5 {link(parts)}, checkpoints {checkpoints(parts)} as the straight run's")
check(best_state(parts) == best_state(straight) != {},
      "best.h5's /state is the straight run's")
check([l.replace(parts, straight) for l in best_lines(out1 + out2)] == want_lines,
      f"the 'best:' lines of both parts are the straight run's: {best_lines(out1 + out2)}")

# 2b. Resumed from an older checkpoint than the best.h5 names: the link names that
# checkpoint's record again. From another directory's checkpoint: chosen again.
code, out, _ = train(every, *loss_args, "io.keep_checkpoints=100", f"io.resume={every}/checkpoints/ckpt_000000007.h5",
                     "train.epochs=1", fresh=False)
line = (f"checkpoint: {every}/checkpoints/best.h5 names ckpt_000000005.h5, the best of the checkpoint resumed from "
        "(it named ckpt_000000010.h5, of a continuation this resume leaves behind)")
check(code == 0 and line in out and link(every) == "ckpt_000000005.h5",
      f"resumed from ckpt 7 (its best at step 5): the line, best.h5 {link(every)}")
# From ckpt 14, mid-epoch 3 (its record: 0.5400 at step 10): the link names ckpt 10
# again, and epoch 3's 0.7658, worse than the record, is no new best.
code, out, _ = train(every, *loss_args, "io.keep_checkpoints=100", f"io.resume={every}/checkpoints/ckpt_000000014.h5",
                     "train.epochs=3", fresh=False)
check(code == 0 and f"checkpoint: {every}/checkpoints/best.h5 names {name}" in out and not best_lines(out) and
      link(every) == name, f"resumed mid-epoch from ckpt 14: the record carried, no 'best:' line, best.h5 {link(every)}")
elsewhere = run_dir + "_elsewhere"
shutil.rmtree(elsewhere, ignore_errors=True)
said = check_line(elsewhere, *loss_args, f"io.resume={straight}/checkpoints/{newest}", "train.epochs=7")
# The trainer's line and --check's say the same of a record dropped.
dropped = (f"{elsewhere}/checkpoints holds no checkpoint of step {best['step']}, which has the best val_loss so "
           f"far ({best['val_loss']:.4f} at epoch {best['epoch']}): the best is chosen again from this run's validations")
check(said == f"checkpoint: would resume from {straight}/checkpoints/{newest} (epoch 7, step {recs[-1]['step']}); "
      + dropped, f"--check from another directory's checkpoint: {said}")
code, out, _ = train(elsewhere, *loss_args, f"io.resume={straight}/checkpoints/{newest}", "train.epochs=7")
line = "checkpoint: " + dropped
last = records(elsewhere)[-1]
check(code == 0 and line in out and link(elsewhere) == f"ckpt_{last['step']:09d}.h5",
      f"resumed from another directory's checkpoint: the line, best.h5 {link(elsewhere)} is epoch 7's")

# 3. --evaluate of best.h5 on 3 ranks.
code, out, _ = run(mpirun(mpiexec, 3, binary, ["--evaluate", nml, f"io.run_dir={straight}",
                                                f"io.resume={straight}/checkpoints/best.h5"]), timeout=300)
said = [json.loads(l[len("evaluation: "):]) for l in out.splitlines() if l.startswith("evaluation: ")]
check(code == 0 and len(said) == 1 and said[0]["val_loss"] == best["val_loss"] and
      said[0]["val_correct"] == best["val_correct"] and said[0]["step"] == best["step"],
      f"--evaluate of best.h5: {said}, the record of step {best['step']}")

# 4. val_acc, in the background: a tie keeps the earlier epoch.
acc = run_dir + "_acc"
code, out, _ = train(acc, "io.keep_best=val_acc", "io.keep_checkpoints=1", "io.checkpoint_async=T")
recs_acc = records(acc)
top = best_of(recs_acc, "val_acc", lower=False)
ties = [r["epoch"] for r in recs_acc if r["val_acc"] == top["val_acc"]]
check(code == 0 and len(ties) > 1, f"val_acc's best {top['val_acc']} at epochs {ties} (a tie, else this proves little)")
check(link(acc) == f"ckpt_{top['step']:09d}.h5", f"best.h5 {link(acc)} is epoch {ties[0]}'s")
st = best_state(acc)
check(st.get("best_val_acc") == top["val_acc"] and "best_val_loss" not in st,
      "its /state/best_val_acc is the record's, and no best_val_loss")
check([r.get("best_val_acc") for r in recs_acc] ==
      [best_of(recs_acc[:i + 1], "val_acc", lower=False)["val_acc"] for i in range(len(recs_acc))] and
      not any("best_val_loss" in r for r in recs_acc), "metrics.jsonl: best_val_acc so far, no best_val_loss")

# 5. Another metric on resume: chosen again from this run's validations.
said = check_line(parts, "train.epochs=7", "io.keep_best=val_acc", "io.keep_checkpoints=1")
dropped = (f"the checkpoint's run kept the best by val_loss ({best['val_loss']:.4f} at epoch {best['epoch']}, step "
           f"{best['step']}) and io.keep_best is 'val_acc': the best is chosen again from this run's validations")
check(said == f"checkpoint: would resume from {parts}/checkpoints/{newest} (epoch 7, step {recs[-1]['step']}); "
      + dropped, f"--check with val_acc: {said}")
said = check_line(straight, "train.epochs=7", "io.keep_best=none")
check(said == f"checkpoint: would resume from {straight}/checkpoints/{newest} (epoch 7, step {recs[-1]['step']}); " +
      dropped.replace("'val_acc': the best is chosen again from this run's validations",
                      f"'none': {straight}/checkpoints/best.h5 is no longer updated"), f"--check with none: {said}")
code, out, _ = train(parts, "train.epochs=7", "io.keep_best=val_acc", "io.keep_checkpoints=1", fresh=False)
line = "checkpoint: " + dropped
last = records(parts)[-1]
check(code == 0 and line in out and link(parts) == f"ckpt_{last['step']:09d}.h5",
      f"resumed with val_acc: the line, and best.h5 {link(parts)} names epoch 7's checkpoint")
check(best_state(parts).get("best_val_acc") == last["val_acc"],
      "its /state/best_val_acc is epoch 7's val_acc")
check(name not in checkpoints(parts), f"{name} is no longer kept (keep 1)")

# 6. Early stopping: train.patience epochs past the best end the run.
early = run_dir + "_early"
stop_args = ["io.keep_best=val_loss", "train.epochs=10", "train.patience=2"]
code, out, _ = train(early, *stop_args)
line = (f"early stop: val_loss has not improved on {best['val_loss']:.4f} (epoch {best['epoch']}) for 2 epochs "
        f"(train.patience = 2); {early}/checkpoints/best.h5 names {name}")
epochs = [r["epoch"] for r in records(early)]
check(code == 0 and line in out and epochs == list(range(1, best["epoch"] + 3)),
      f"patience 2: exit {code}, the line, epochs {epochs} end 2 past the best")
check(latest(early) == f"ckpt_{records(early)[-1]['step']:09d}.h5" and link(early) == name,
      f"its last checkpoint {latest(early)} is written; best.h5 {link(early)}")
check(state(os.path.join(early, "checkpoints", latest(early))).get("best_epoch") == best["epoch"],
      f"the last checkpoint's /state/best_epoch is {best['epoch']}")
code, out, _ = train(early, *stop_args, fresh=False)
line = (f"nothing to train: the run stopped early at epoch {best['epoch'] + 2}: val_loss has not improved on "
        f"{best['val_loss']:.4f} (epoch {best['epoch']}) for 2 epochs (train.patience = 2); raise train.patience "
        "(0: off) to continue it")
check(code == 0 and line in out and len(records(early)) == len(epochs), "started again: nothing to train, the line")
stop_ckpt = f"{early}/checkpoints/{latest(early)}"
said = check_line(early, *stop_args)
check(said == f"checkpoint: would start from {stop_ckpt} (epoch {epochs[-1]}, step {records(early)[-1]['step']}) "
      "and train nothing: " + line[len("nothing to train: "):], f"--check of the stopped run: {said}")
said = check_line(early, *stop_args, "train.patience=3")
check(said == f"checkpoint: would resume from {stop_ckpt} (epoch {epochs[-1] + 1}, step {records(early)[-1]['step']}); "
      f"the best val_loss so far, {best['val_loss']:.4f} at epoch {best['epoch']}, is {name}",
      f"--check with patience 3: {said}")
code, out, _ = train(early, *stop_args, "train.patience=3", fresh=False)
epochs = [r["epoch"] for r in records(early)]
check(code == 0 and "for 3 epochs (train.patience = 3)" in out and epochs == list(range(1, best["epoch"] + 4)),
      f"patience 3: epoch {best['epoch'] + 3} alone, then the stop: epochs {epochs}")
said = check_line(early, *stop_args, "train.patience=0", f"train.epochs={epochs[-1]}")
check(said == f"checkpoint: would start from {early}/checkpoints/{latest(early)} (epoch {epochs[-1]}, step "
      f"{records(early)[-1]['step']}) and train nothing: the run is complete (epoch {epochs[-1]} of {epochs[-1]}, "
      f"step {records(early)[-1]['step']}); raise train.epochs to continue it, or set io.resume = 'never' for a new run",
      f"--check of the complete run: {said}")

# train.min_delta: epoch 2 beats epoch 1 by less than it, so patience counts from epoch 1.
first = recs[0]
check(best["epoch"] == 2 and 0 < first["val_loss"] - best["val_loss"] < 0.4,
      f"epoch 2 improves on epoch 1 by {first['val_loss'] - best['val_loss']:.4f}, less than 0.4 (else this proves little)")
delta = run_dir + "_delta"
delta_args = stop_args + ["train.min_delta=0.4"]
for two_parts in [False, True]:
    if two_parts:
        code1, _, _ = train(delta, *delta_args, "train.epochs=2")
        code, out, _ = train(delta, *delta_args, fresh=False)
        code = code or code1
    else:
        code, out, _ = train(delta, *delta_args)
    line = (f"early stop: val_loss has not improved by more than 0.4 on {first['val_loss']:.4f} (epoch 1) for 2 epochs "
            f"(train.patience = 2, train.min_delta = 0.4); {delta}/checkpoints/best.h5 names {name}")
    epochs = [r["epoch"] for r in records(delta)]
    st = state(os.path.join(delta, "checkpoints", latest(delta)))
    check(code == 0 and line in out and epochs == [1, 2, 3] and link(delta) == name and
          st.get("patience_epoch") == 1 and st.get("best_epoch") == 2,
          f"min_delta 0.4{' in two parts' if two_parts else ''}: exit {code}, the line, epochs {epochs}, best.h5 "
          f"{link(delta)}, /state patience_epoch {st.get('patience_epoch')} best_epoch {st.get('best_epoch')}")

# A checkpoint of before min_delta has no /state/patience_*: patience counts from its best.
code, _, _ = train(delta, *delta_args, "train.epochs=2")
ckpt = os.path.join(delta, "checkpoints", latest(delta))
with h5py.File(ckpt, "r+") as f:
    del f["state/patience_value"], f["state/patience_epoch"]
rewrite_checksum(ckpt)
code2, out, _ = train(delta, *delta_args, fresh=False)
epochs = [r["epoch"] for r in records(delta)]
check(code == 0 and code2 == 0 and epochs == [1, 2, 3, 4] and "on 0.5400 (epoch 2) for 2 epochs" in out,
      f"resumed from a checkpoint without /state/patience_*: counted from the best (epoch 2), epochs {epochs}")

# The same for val_acc (higher is better): epoch 2's 0.8 beats epoch 1's 0.6 by less than 0.25.
check(recs[1]["val_acc"] - first["val_acc"] == max(r["val_acc"] for r in recs) - first["val_acc"] < 0.25,
      "val_acc: epoch 2's is the best, and beats epoch 1's by less than 0.25 (else this proves little)")
code, out, _ = train(delta, "io.keep_best=val_acc", "train.epochs=10", "train.patience=2", "train.min_delta=0.25")
line = (f"early stop: val_acc has not improved by more than 0.25 on {first['val_acc']:.4f} (epoch 1) for 2 epochs "
        f"(train.patience = 2, train.min_delta = 0.25); {delta}/checkpoints/best.h5 names {name}")
epochs = [r["epoch"] for r in records(delta)]
check(code == 0 and line in out and epochs == [1, 2, 3] and link(delta) == name,
      f"val_acc with min_delta 0.25: exit {code}, the line, epochs {epochs}, best.h5 {link(delta)}")

# 7. Bad input: one line each, before any training.
errors = run_dir + "_errors"
for args, words in [
        ([nml, "io.keep_best=val_loss", "data.val_files="],
         r"io\.keep_best=val_loss: needs data\.val_files \(the best checkpoint is chosen by validation\)$"),
        ([nml, "io.keep_best=val_acc5"],
         r"io\.keep_best = 'val_acc5' needs top-5 accuracy, which models of more than 5 classes have; "
         r"this one has 3: use 'val_acc' or 'val_loss'"),
        ([regression_nml, "io.keep_best=val_acc"],
         r"io\.keep_best = 'val_acc' needs model\.loss = 'cross_entropy'; this run's loss is mse: use 'val_loss'"),
        ([nml, "train.patience=2"],
         r"train\.patience=2: needs io\.keep_best, the validation metric whose improvement it waits for$"),
        ([nml, "io.keep_best=val_loss", "train.min_delta=0.1"],
         r"train\.min_delta=0\.1: needs train\.patience, the early stopping it tunes$")]:
    shutil.rmtree(errors, ignore_errors=True)
    code, out, err = run(mpirun(mpiexec, 2, binary, args + [f"io.run_dir={errors}"]), timeout=120)
    expect_one_error(code, out, err, words)  # exits on a mismatch
    check(code == 1 and not re.search(r"^epoch 1", out, re.M) and "Traceback" not in err and
          "terminate called" not in err, f"{args[-1]}: exit {code} (1), one error line, nothing trained")

# 8. Something else at best.h5: one line at start-up, the thing left alone.
squat = run_dir + "_squat"
for kind in ["a file", "a directory"]:
    shutil.rmtree(squat, ignore_errors=True)
    path = os.path.join(squat, "checkpoints", "best.h5")
    os.makedirs(os.path.dirname(path))
    if kind == "a file":
        with open(path, "w") as f:
            f.write("my model\n")
    else:
        os.mkdir(path)
    words = (rf"io\.keep_best: {re.escape(path)} is {kind}, not the link to the best checkpoint that ddp_train "
             r"keeps at that name: move or rename it$")
    for check_only in [False, True]:
        args = (["--check"] if check_only else []) + [nml, "io.keep_best=val_loss", f"io.run_dir={squat}"]
        code, out, err = run(mpirun(mpiexec, 2, binary, args), timeout=120)
        expect_one_error(code, out, err, words)
        check(code == 1 and not re.search(r"^epoch 1", out, re.M) and not checkpoints(squat) and
              (os.path.isdir(path) if kind == "a directory" else open(path).read() == "my model\n"),
              f"{kind} at best.h5, {'--check' if check_only else 'a run'}: exit {code} (1), one line, left as it was")

if failures:
    sys.exit(f"FAIL: {len(failures)} check(s)")
print("PASS")
