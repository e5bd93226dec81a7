#!/usr/bin/env python3
"""NCCL between W ranks on one GPU (GPU build): real ddp_train runs on the tiny set,
compared with each other. The ranks run through a launcher (tools/nccl_one_gpu) that
makes each a host of its own to NCCL, so NCCL accepts them on one GPU and they talk
over its socket transport on loopback.

Every run: tests/e2e/tiny.nml (80 training samples, 25 validation) with an MLP of
70,915 parameters (linear(256), relu, linear(256), relu, linear(3): 70 blocks of 4 KB,
so every rank owns a ZeRO share up to W = 4), batch 4 per rank, SGD with momentum and
weight decay, 3 epochs; buckets of 0.1 MB (the first 0.01 MB), so several bucket
collectives are in flight during backward; comm.check_every = 1 (the ranks' parameters
compared after every step: a rank that stepped where another skipped, or took another
share, ends the run). Each run's output goes to RUN_DIR.log; its key lines are printed.

CASE (one per test):
  equal       NCCL twice: bitwise (final checkpoint's /model and /optimizer, and every
              epoch's train_loss, val_loss, val_correct). NCCL against MPI staged
              through pinned host memory (comm.backend = 'mpi', DDP_MPI_CUDA_AWARE=0) on
              the same GPU: the sums' order differs, so within TOL_ORDER (below), the
              measured difference printed. comm.zero = 1 and 2 against 0 on each path:
              NCCL zero=1 bitwise; NCCL zero=2 within TOL_ORDER (each share is summed by
              ncclReduce where zero=0 sums by ncclAllReduce); MPI zero=1 and zero=2
              bitwise (MPI on device buffers all-reduces stage 2's gradients as stage 0
              does). The first NCCL run has NCCL_DEBUG=INFO (into files of their own,
              RUN_PREFIX_nccl_z0.nccl.HOST.PID): its channels must go
              `via NET/Socket`, none via P2P or SHM.
  graph       train.cuda_graph = 'on' (the step and its NCCL bucket all-reduces in one
              graph, replayed) against 'off', 2 epochs: bitwise, and each epoch ran
              micro-batches from a graph.
  resume      a run on W ranks (paced, 50 ms a step) stopped by SIGUSR1 sent to the ranks
              early in epoch 2 (exit 75 after its checkpoint, at step S), resumed on W2
              (--np-after) to the end.
              The straight run on W ranks, checkpointing every S steps: its checkpoint
              of step S bitwise the stop's (/model, /optimizer, /state), and that
              checkpoint resumed on W2 ends bitwise where the stopped run resumed ends.
  validation  a 2-epoch run on W ranks; its last record's val_loss, val_acc, val_correct
              and val_count bitwise those of `ddp_train --evaluate` on 1 rank and on W
              ranks (validation chunks have one owner each: the sums are exact).
  skip        DDP_INJECT_FAULT=nan_gradient@rank1:step2 with train.nonfinite = 'skip':
              exit 0, the warning for step 3 of epoch 1, skipped_steps 1 in epoch 1 and 0
              after, a finite final checkpoint (every rank skipped that step together:
              comm.check_every = 1 held).
  fp16        train.precision = 'fp16' from a loss scale of 2^20 that overflows at first
              (growth interval longer than the run): tests/e2e/check_metrics.py's fp16
              rules (final scale = 2^20 / 2^skipped, at least 3 skipped) over NCCL, and
              the same skipped steps and scales each epoch over staged MPI, whose final
              checkpoint is within TOL_ORDER of NCCL's.

The tolerance where the sums' order differs, TOL_ORDER = 1e-5 of the largest |value|
of each array (the largest over the arrays): float32 sums of W terms in another order
differ by an ulp or two per step; over these 15 to 30 steps the CPU build's paths
(MPI_Allreduce, MPI_Reduce_scatter, the shared-memory window) end 1.6e-7 to 1.9e-7
apart on 4 ranks. 1e-5 leaves room for NCCL's orders and the GPU's kernels and is far
below what a wrong sum gives (a learning rate 1% off, --mutate: 2e-2).

--cpu-build: the CPU build stands in, to check this script's own logic where no GPU
is: 'nccl' runs are MPI with comm.shared_memory = F (MPI's collectives, not the
shared-memory window), 'mpi' runs are the window (comm.backend = 'mpi'), and what only
the GPU shows (the comm: lines of the GPU build, NET/Socket, the graph's lines; 'on'
is 'off') is not required. --mutate: the second run of each comparison differs
(train.lr 1% higher; the W-rank evaluation of epoch 1's checkpoint; no injected NaN;
the MPI run's loss scale doubled), so every case must fail: a check of the checks.

usage: nccl_runs.py CASE MPIEXEC DDP_TRAIN TINY.nml RUN_PREFIX --np W [--np-after W2]
                    [--launcher PROGRAM] [--cpu-build] [--mutate]
Exit 0 with PASS, 1 with the failed checks (FAIL lines).
"""
import argparse
import glob
import json
import math
import os
import re
import signal
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
from common import EX_TEMPFAIL, arrays, children, epoch_end_step, latest, progress_step, state  # noqa: E402

TOL_ORDER = 1e-5
TRAIN_SAMPLES = 80  # tests/e2e/make_test_data.py's tiny set
MLP = "model.layers=linear(256),relu,linear(256),relu,linear(3)"
BASE = ["train.epochs=3", "train.batch_size=4", MLP, "train.optimizer=sgd", "train.lr=0.02", "train.momentum=0.9",
        "train.weight_decay=1e-4", "train.log_every=0", "comm.bucket_mb=0.1", "comm.first_bucket_mb=0.01",
        "comm.check_every=1", "comm.timeout_s=60"]
LR_MUTATED = ["train.lr=0.0202"]
KEY_LINES = re.compile(r"^(comm: |gradients: |ZeRO stage |CUDA graph: |epoch \d+/|resumed from |preempted: |"
                       r"evaluation of |error: |warning: |rank \d+ \(|.*skipped: a non-finite)")
METRIC_KEYS = ("train_loss", "val_loss", "val_correct")


class RunFailed(Exception):
    pass


class Runs:
    def __init__(self, a):
        self.a = a
        self.failures = []

    def check(self, ok, what):
        print(("ok: " if ok else "FAIL: ") + what, flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    # --- the runs ------------------------------------------------------------------

    def backend(self, name):
        """(overrides, environment, line the run must print) of 'nccl' or 'mpi'."""
        if self.a.cpu_build:
            if name == "nccl":  # MPI's own collectives stand in for NCCL's
                return (["comm.backend=mpi", "comm.shared_memory=F"], {},
                        r"^gradients: .*, MPI (reduce-scatter to the shares )?during backward")
            return ["comm.backend=mpi"], {}, r"^gradients: .*summed in a shared-memory window"
        if name == "nccl":
            return ["comm.backend=nccl"], {}, r"^comm: NCCL on device buffers"
        return (["comm.backend=mpi"], {"DDP_MPI_CUDA_AWARE": "0"},
                r"^comm: MPI, device buffers staged through pinned host memory")

    def command(self, np_, args):
        launcher = [self.a.launcher] if self.a.launcher else []
        # Through the launcher (ranks time-sliced on one GPU), the ranks unbound: Open MPI
        # would bind each of 2 to a core, which its watchdog, NCCL's proxy and socket
        # threads and CUDA's would share.
        unbound = ["--bind-to", "none"] if self.a.launcher else []
        return [self.a.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(np_)] + unbound + launcher + [
            self.a.binary] + list(args)

    def launch(self, name, np_, backend, extra=(), env=None, mutated=None, expect_rc=0, stop_in_epoch=None,
               fresh=True, evaluate=False, timeout=120):
        """One ddp_train run in RUN_PREFIX_name: returns (run_dir, output). mutated: the
        overrides that --mutate adds (the second run of a comparison). stop_in_epoch E:
        SIGUSR1 to every rank at epoch E's first progress line (the stop lands a step or
        two later). fresh=False: the run directory is kept (a resume); its output goes to
        RUN_DIR_resumed.log. timeout: seconds the run may take (a run takes 1 to 6 s;
        ddp_train's own watchdog, comm.timeout_s = 60, ends one that hangs in a
        collective): past it, whether or not it prints, SIGTERM to mpiexec, then 5 s
        later SIGKILL to it and its ranks, so that no rank keeps the GPU and no silent
        hang (outside the watchdog: at exit, say) spends the test's whole CTest limit."""
        run_dir = f"{self.a.prefix}_{name}"
        if fresh and not evaluate:
            shutil.rmtree(run_dir, ignore_errors=True)
        over, benv, line = self.backend(backend)
        args = (["--evaluate"] if evaluate else []) + [self.a.nml] + BASE + over + list(extra)
        if self.a.mutate and mutated:
            args += mutated
        if not evaluate:
            args.append(f"io.run_dir={run_dir}")
        cmd = self.command(np_, args)
        full_env = dict(os.environ, **benv, **(env or {}))
        shown = " ".join(f"{k}={v}" for k, v in {**benv, **(env or {})}.items())
        print(f"$ {shown + ' ' if shown else ''}{' '.join(cmd)}", flush=True)
        t0 = time.time()
        # The two streams apart: mpirun forwards them separately, in chunks, so one pipe
        # for both could split a line (tests/e2e/nonfinite.py).
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                             env=full_env)
        errors = []
        reader = threading.Thread(target=lambda: errors.extend(p.stderr), daemon=True)
        reader.start()
        lines, sent, per_epoch = [], False, None
        timed_out = threading.Event()

        def end_run():
            timed_out.set()
            ranks = children(p.pid)
            p.terminate()
            time.sleep(5)
            for pid in ranks + [p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        timer = threading.Timer(timeout, end_run)
        timer.daemon = True
        timer.start()
        for text in p.stdout:
            lines.append(text)
            if KEY_LINES.match(text):
                sys.stdout.write("  " + text)
            if stop_in_epoch and not sent:
                if per_epoch is None:
                    per_epoch = epoch_end_step(text, stop_in_epoch - 1)
                elif (progress_step(text, stop_in_epoch) or 0) > per_epoch * (stop_in_epoch - 1):
                    ranks = children(p.pid)
                    for pid in ranks:
                        os.kill(pid, signal.SIGUSR1)
                    print(f"  >>> SIGUSR1 to the ranks {ranks} after: {text.strip()}", flush=True)
                    sent = True
        rc = p.wait()
        timer.cancel()
        if timed_out.is_set():
            timer.join()  # its SIGKILLs sent: no rank that ignored SIGTERM left holding the GPU
        reader.join(timeout=10)
        for text in errors:
            if KEY_LINES.match(text):
                sys.stdout.write("  " + text)
        lines += ["--- standard error\n"] + errors
        out = "".join(lines)
        log = run_dir + ("_resumed" if not fresh else "") + ".log"
        # A run that failed before making its run directory: runs/ may not exist yet.
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        with open(log, "w") as f:
            f.write(out)
        sockets = len(re.findall(r"via NET/Socket", out))
        print(f"  exit status {rc} after {time.time() - t0:.1f} s; output in {log}"
              + (f"; {sockets} NCCL channel lines via NET/Socket" if sockets else ""), flush=True)
        if rc != expect_rc or (stop_in_epoch and not sent) or timed_out.is_set():
            sys.stdout.write("".join(lines[-60:]))
            raise RunFailed(f"{name} on {np_} rank(s): exit status {rc}, expected {expect_rc}"
                            + (f"; ended after {timeout} s, its time limit" if timed_out.is_set() else "")
                            + ("" if not stop_in_epoch or sent else "; the stop signal was never sent"))
        if not evaluate:  # --evaluate makes no gradients
            self.check(re.search(line, out, re.M) is not None, f"{name}: a line /{line}/")
        return run_dir, out

    def train(self, name, np_, backend, *extra, **kw):
        """launch() with the overrides as arguments."""
        return self.launch(name, np_, backend, extra, **kw)

    # --- what the runs left ----------------------------------------------------------

    @staticmethod
    def final(run_dir, groups=("model", "optimizer")):
        return arrays(os.path.join(run_dir, "checkpoints", latest(run_dir)), groups=groups)

    @staticmethod
    def records(run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    @staticmethod
    def difference(ref, got):
        """(bitwise equal, largest |difference| / max |reference| over the arrays, worst array)."""
        if sorted(ref) != sorted(got):
            return False, math.inf, f"datasets {sorted(ref)} against {sorted(got)}"
        equal, worst, where = True, 0.0, ""
        for k in sorted(ref):
            a, b = np.atleast_1d(ref[k]), np.atleast_1d(got[k])
            if a.dtype != b.dtype or a.shape != b.shape:
                return False, math.inf, f"{k}: {a.dtype}{a.shape} against {b.dtype}{b.shape}"
            if a.tobytes() == b.tobytes():
                continue
            equal = False
            if a.dtype.kind != "f":  # counts (the optimizer's steps): no tolerance
                return False, math.inf, f"{k}, integers"
            scale = float(np.max(np.abs(a))) or 1.0
            d = float(np.max(np.abs(a.astype(np.float64) - b))) / scale
            if not d <= worst:  # NaN counts as the worst
                worst, where = d, k
        return equal, worst, where

    def compare(self, ref_dir, got_dir, what, tol=None):
        """The final checkpoints: bitwise (tol None) or within tol; the difference printed."""
        equal, worst, where = self.difference(self.final(ref_dir), self.final(got_dir))
        steps = [state(os.path.join(d, "checkpoints", latest(d)))["step"] for d in (ref_dir, got_dir)]
        verdict = "bitwise equal" if equal else f"largest difference {worst:.3g} of the largest value ({where})"
        rule = "must be bitwise" if tol is None else f"tolerance {tol:g}"
        self.check(steps[0] == steps[1], f"{what}: final checkpoints at the same step ({steps[0]}, {steps[1]})")
        return self.check(equal or (tol is not None and worst <= tol), f"{what}: {verdict} ({rule})")

    def compare_records(self, ref_dir, got_dir, what, tol=None, keys=METRIC_KEYS):
        a, b = self.records(ref_dir), self.records(got_dir)
        if not self.check(len(a) == len(b) and a, f"{what}: {len(a)} and {len(b)} metrics records"):
            return
        worst = 0.0
        for ra, rb in zip(a, b):
            for k in keys:
                x, y = ra.get(k), rb.get(k)
                if x == y:
                    continue
                if tol is None or not isinstance(x, float) or not isinstance(y, float):
                    self.check(False, f"{what}: epoch {ra.get('epoch')} {k} {x!r} against {y!r} (must be equal)")
                    return
                worst = max(worst, abs(x - y) / max(abs(x), 1e-30))
        rule = "must be equal" if tol is None else f"tolerance {tol:g}"
        self.check(worst <= (tol or 0.0), f"{what}: {', '.join(keys)} of {len(a)} epochs: "
                   + ("equal" if worst == 0 else f"largest relative difference {worst:.3g}") + f" ({rule})")


# --- the cases ---------------------------------------------------------------------------

def case_equal(r, W):
    cpu = r.a.cpu_build
    # NCCL's INFO lines into files of their own (a file a rank: %h host, %p pid), not
    # among the ranks' output, where mpirun's chunks of one rank's could split a line
    # of another's that is checked.
    debug_prefix = os.path.abspath(f"{r.a.prefix}_nccl_z0.nccl")
    for old in glob.glob(debug_prefix + ".*"):
        os.remove(old)
    debug = {} if cpu else {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": debug_prefix + ".%h.%p"}
    nccl, out = r.train("nccl_z0", W, "nccl", env=debug)
    if not cpu:
        info = ""
        for name in sorted(glob.glob(debug_prefix + ".*")):
            with open(name, errors="replace") as f:
                info += f.read()
        socket = len(re.findall(r"via NET/Socket", info))
        other = re.findall(r"via (?:P2P|SHM|NVLS|CollNet)\S*", info)
        r.check(socket > 0 and not other,
                f"NCCL's channels: {socket} via NET/Socket, {len(other)} via P2P/SHM/NVLS/CollNet {other[:3]}")
    again, _ = r.train("nccl_z0_again", W, "nccl", mutated=LR_MUTATED)
    r.compare(nccl, again, f"W={W} NCCL run twice")
    r.compare_records(nccl, again, f"W={W} NCCL run twice")
    mpi, _ = r.train("mpi_z0", W, "mpi", mutated=LR_MUTATED)
    r.compare(nccl, mpi, f"W={W} NCCL against MPI staged through the host", tol=TOL_ORDER)
    r.compare_records(nccl, mpi, f"W={W} NCCL against MPI staged through the host", tol=TOL_ORDER,
                      keys=("train_loss", "val_loss"))
    for backend, ref in (("nccl", nccl), ("mpi", mpi)):
        for zero in (1, 2):
            # --mutate: the side of each comparison that its reference is not
            run, out = r.train(f"{backend}_z{zero}", W, backend, f"comm.zero={zero}",
                               mutated=LR_MUTATED if backend == "nccl" else None)
            r.check(f"ZeRO stage {zero}:" in out, f"{backend} zero={zero}: a 'ZeRO stage {zero}:' line")
            if zero == 1:
                tol, why = None, "zero=0's all-reduce, then each share updated and gathered"
            elif backend == "nccl":
                tol, why = TOL_ORDER, "ncclReduce per share against ncclAllReduce"
            else:
                tol, why = None, "the gradients all-reduced as at zero=0"
            r.compare(ref, run, f"W={W} {backend} zero={zero} against zero=0 ({why})", tol=tol)


def case_graph(r, W):
    setting = "off" if r.a.cpu_build else "on"
    off, _ = r.train("uncaptured", W, "nccl", "train.epochs=2", "train.cuda_graph=off")
    on, out = r.train("captured", W, "nccl", "train.epochs=2", f"train.cuda_graph={setting}", mutated=LR_MUTATED)
    if not r.a.cpu_build:
        plan = r"^CUDA graph: forward, loss and backward with the gradient all-reduce \(NCCL\)"
        r.check(re.search(plan, out, re.M) is not None,
                "the graph holds the NCCL all-reduce ('CUDA graph: ... with the gradient all-reduce (NCCL)')")
        counts = [(int(a), int(b)) for a, b in
                  re.findall(r"^CUDA graph: (\d+) of (\d+) micro-batches of epoch \d+ ran from a graph", out, re.M)]
        r.check(len(counts) == 2 and all(n > 0 for n, _ in counts),
                f"micro-batches from a graph (of all) per epoch: {counts}; each epoch some")
    r.compare(off, on, f"W={W} train.cuda_graph = '{setting}' against 'off'")
    r.compare_records(off, on, f"W={W} train.cuda_graph = '{setting}' against 'off'")


def case_resume(r, W, W2):
    # The stopped run, paced (50 ms a step) so that the signal lands mid-epoch.
    paced = {"DDP_TEST_STEP_DELAY_US": "50000"}
    stopped, out = r.train("stopped", W, "nccl", "train.log_every=1", env=paced, expect_rc=EX_TEMPFAIL,
                           stop_in_epoch=2)
    r.check(re.search(rf"^preempted: checkpoint .* exit {EX_TEMPFAIL} for requeue", out, re.M) is not None,
            "a 'preempted: checkpoint ... exit 75 for requeue' line")
    stop = os.path.join(stopped, "checkpoints", latest(stopped))
    st = state(stop)
    S = st["step"]
    print(f"stopped at {stop}: {st}")
    if not r.check(st["epoch"] == 1 and 0 < st["consumed"] < TRAIN_SAMPLES and st["world_size"] == W,
                   f"the stop is mid-epoch 2 on {W} ranks (epoch {st['epoch']} done, {st['consumed']} of "
                   f"{TRAIN_SAMPLES} samples, world_size {st['world_size']})"):
        return
    straight, _ = r.train("straight", W, "nccl", "train.log_every=1", f"io.checkpoint_every_steps={S}",
                          "io.keep_checkpoints=100")
    same = os.path.join(straight, "checkpoints", f"ckpt_{S:09d}.h5")
    if not r.check(os.path.exists(same), f"the straight run wrote {same}"):
        return
    groups = ("model", "optimizer", "state")
    equal, _, where = r.difference(arrays(stop, groups), arrays(same, groups))
    r.check(equal, f"the stop's checkpoint (step {S}) against the straight run's of step {S}: "
            + ("bitwise equal" if equal else f"differs ({where})") + " (must be bitwise)")
    _, out = r.train("stopped", W2, "nccl", "train.log_every=1", fresh=False)
    r.check(f"resumed from {stop} at epoch 2 step {S}" in out and f"continuing on {W2})" in out,
            f"'resumed from {stop} at epoch 2 step {S} (... continuing on {W2})'")
    ref, out = r.train("from_straight", W2, "nccl", "train.log_every=1", f"io.resume={same}", mutated=LR_MUTATED)
    r.check(f"resumed from {same} at epoch 2 step {S}" in out, f"'resumed from {same} at epoch 2 step {S}'")
    what = f"stopped on {W} at step {S}, resumed on {W2}, against the straight run's step {S} resumed on {W2}"
    r.compare(ref, stopped, what)
    last = [r.records(d)[-1] for d in (ref, stopped)]
    r.check(all(last[0].get(k) == last[1].get(k) for k in METRIC_KEYS + ("epoch", "world_size")),
            f"{what}: the last record's {', '.join(METRIC_KEYS)} equal: "
            + "; ".join(f"{k} {last[0].get(k)!r} {last[1].get(k)!r}" for k in METRIC_KEYS))


def case_validation(r, W):
    run, _ = r.train("run", W, "nccl", "train.epochs=2")
    records = r.records(run)
    want = records[-1]
    # --mutate: the W-rank evaluation reads epoch 1's checkpoint
    first = os.path.join(run, "checkpoints", f"ckpt_{records[0]['step']:09d}.h5")
    epoch1 = [f"io.resume={first}"]
    for n, backend in ((1, "mpi"), (W, "nccl")):
        _, out = r.launch(f"evaluate_np{n}", n, backend, [f"io.run_dir={run}"], evaluate=True,
                          mutated=epoch1 if n == W else None)
        said = [json.loads(l[len("evaluation: "):]) for l in out.splitlines() if l.startswith("evaluation: ")]
        if not r.check(len(said) == 1, f"--evaluate on {n} rank(s): one 'evaluation: {{...}}' line"):
            continue
        got = said[0]
        keys = ("val_loss", "val_acc", "val_correct", "val_count")
        r.check(all(got.get(k) == want.get(k) for k in keys) and got.get("step") == want["step"],
                f"--evaluate on {n} rank(s) against the {W}-rank run's record of step {want['step']}: "
                + "; ".join(f"{k} {got.get(k)!r} {want.get(k)!r}" for k in keys) + " (must be bitwise)")


def case_skip(r, W):
    fault = {} if r.a.mutate else {"DDP_INJECT_FAULT": "nan_gradient@rank1:step2"}
    run, out = r.train("skip", W, "nccl", "train.epochs=2", "train.nonfinite=skip", env=fault)
    r.check(re.search(r"step 3 of epoch 1 skipped: a non-finite loss or gradient", out) is not None,
            "the warning 'step 3 of epoch 1 skipped: a non-finite loss or gradient'")
    skipped = [rec.get("skipped_steps", 0) for rec in r.records(run)]
    r.check(skipped == [1, 0], f"skipped_steps per epoch {skipped}, expected [1, 0]")
    finite = all(np.isfinite(v).all() for v in r.final(run).values())
    r.check(finite, "the final checkpoint's /model and /optimizer are finite")


def case_fp16(r, W):
    scale = 2.0 ** 20
    fp16 = ["train.precision=fp16", f"train.loss_scale={scale:.0f}", "train.loss_scale_growth_interval=100000"]
    nccl, _ = r.train("fp16_nccl", W, "nccl", *fp16)
    check = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "check_metrics.py"),
             nccl, "--epochs", "3", "--world-size", str(W), "--loss-scale-init", f"{scale:.0f}", "--min-skipped", "3"]
    print("$ " + " ".join(check), flush=True)
    p = subprocess.run(check, capture_output=True, text=True)
    sys.stdout.write(p.stdout + p.stderr)
    r.check(p.returncode == 0, "check_metrics.py's fp16 rules on the NCCL run")
    mpi, _ = r.train("fp16_mpi", W, "mpi", *fp16, mutated=[f"train.loss_scale={2 * scale:.0f}"])
    a, b = ([(rec.get("skipped_steps"), rec.get("loss_scale")) for rec in r.records(d)] for d in (nccl, mpi))
    r.check(a == b, f"(skipped steps, loss scale) per epoch: NCCL {a}, MPI {b} (must be equal)")
    r.compare(nccl, mpi, f"W={W} fp16 NCCL against MPI staged through the host", tol=TOL_ORDER)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=("equal", "graph", "resume", "validation", "skip", "fp16"))
    ap.add_argument("mpiexec")
    ap.add_argument("binary")
    ap.add_argument("nml")
    ap.add_argument("prefix")
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--np-after", type=int, help="resume: the ranks the stopped run resumes on")
    ap.add_argument("--launcher", help="the program each rank runs ddp_train through (tools/nccl_one_gpu)")
    ap.add_argument("--cpu-build", action="store_true", help="the CPU build stands in (this script's own check)")
    ap.add_argument("--mutate", action="store_true", help="the second run of each comparison differs: must fail")
    a = ap.parse_args()
    if a.case == "resume" and not a.np_after:
        ap.error("resume needs --np-after")
    r = Runs(a)
    try:
        if a.case == "resume":
            case_resume(r, a.np, a.np_after)
        else:
            globals()[f"case_{a.case}"](r, a.np)
    except RunFailed as e:
        r.check(False, str(e))
    if r.failures:
        print(f"FAIL: {len(r.failures)} check(s): " + "; ".join(r.failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
