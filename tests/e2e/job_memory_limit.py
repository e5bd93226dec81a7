#!/usr/bin/env python3
"""A run under a job's memory limit, with the kernel's real one: mpirun and its
2 ranks run in a memory cgroup of their own (v1 memory.limit_in_bytes or v2
memory.max), as Slurm's task/cgroup puts a job with --mem. The data: 2 training
shards of 100 MiB and a validation shard of 5 MiB (float32, 2048 features).

With LIMIT_MIB (360) the node holds one copy of the data, not two:
  1. data.mode=preload: one copy per node in shared memory, exit 0, and the losses of
     the same run streamed without a limit (the reference);
  2. data.mode=preload data.preload_shared=F: a copy per rank would not fit: one line
     naming the need, the free memory and the cgroup's limit, exit 1, and no rank
     killed by the kernel (the cgroup's oom_kill count unchanged). Before the check
     this was mpirun's "exited on signal 9 (Killed)";
  3. data.mode=auto: streamed, with a line saying why, and the reference's losses.
With SMALL_MIB (150), less than one copy:
  4. data.mode=preload: the line for one copy, exit 1, no kill.
With /dev/shm a 32 MiB tmpfs (a mount namespace of its own: unshare -m):
  5. data.mode=preload, no cgroup limit: a warning that there is no shared memory
     for the preload, a copy on every rank, exit 0, the reference's losses;
  6. the same under LIMIT_MIB: two copies do not fit: the line, exit 1, no kill.
Streamed, a model whose parameters and gradients fit in LIMIT_MIB but whose AdamW
state does not (12.6 million parameters: 2 x 2 x 48 MiB held, 2 x 96 MiB to come):
  7. one line naming what the run still needs (optimizer state and activations, as
     the memory line counts them) and the room, exit 1, no kill. Before the check
     the kernel killed a rank as the optimizer's state was made.
Exits 77 (skip) where no memory cgroup can be made (not root, or a v2 tree whose
memory controller is not delegated here), or, for 5 and 6, where unshare -m
cannot mount.

usage: job_memory_limit.py MPIEXEC DDP_TRAIN WORKDIR
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_test_data import shard  # noqa: E402

SKIP = 77
LIMIT_MIB = 360
SMALL_MIB = 150
MIB = 1 << 20


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def memory_cgroup():
    """This process's memory cgroup directory, and whether it is v2; None if none."""
    v1 = v2 = None
    for line in open("/proc/self/cgroup"):
        hid, ctrls, path = line.rstrip("\n").split(":", 2)
        if "memory" in ctrls.split(","):
            v1 = path
        if hid == "0" and ctrls == "":
            v2 = path
    for line in open("/proc/self/mountinfo"):
        w = line.split()
        dash = w.index("-")
        fstype, opts = w[dash + 1], w[dash + 3].split(",")
        root, mount = w[3], w[4]
        path = v1 if fstype == "cgroup" and "memory" in opts else v2 if fstype == "cgroup2" else None
        if path is None or not path.startswith(root.rstrip("/")):
            continue
        d = mount + path[len(root.rstrip("/")):]
        if fstype == "cgroup2" and "memory" not in open(os.path.join(d, "cgroup.controllers")).read().split():
            continue
        return d, fstype == "cgroup2"
    return None, False


def make_cgroup():
    parent, v2 = memory_cgroup()
    if parent is None or os.geteuid() != 0:
        print("SKIP: no memory cgroup to make one under (or not root)")
        sys.exit(SKIP)
    d = os.path.join(parent, f"ddp_preload_test_{os.getpid()}")
    try:
        os.mkdir(d)
        with open(os.path.join(d, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
            f.write(str(LIMIT_MIB * MIB))
    except OSError as e:
        if os.path.isdir(d):
            os.rmdir(d)
        print(f"SKIP: cannot make a memory cgroup with a limit under {parent}: {e}")
        sys.exit(SKIP)
    return d, v2


def set_limit(cg, v2, mib):
    with open(os.path.join(cg, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
        f.write(str(mib * MIB) if mib else ("max" if v2 else "-1"))


def oom_kills(cg, v2):
    text = open(os.path.join(cg, "memory.events" if v2 else "memory.oom_control")).read()
    m = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(m.group(1)) if m else 0


def make_data(d):
    rng = np.random.default_rng(11)
    os.makedirs(d, exist_ok=True)
    for name, n in (("train_000.h5", 12800), ("train_001.h5", 12800), ("val_000.h5", 640)):
        x = rng.standard_normal((n, 2048), dtype=np.float32)
        shard(os.path.join(d, name), x, x[:, :4].argmax(axis=1).astype(np.int64))


mpiexec, binary, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
data = os.path.join(work, "data")
make_data(data)
nml = os.path.join(work, "preload.nml")
with open(nml, "w") as f:
    f.write(f"&data\n  train_files = '{data}/train_*.h5'\n  val_files = '{data}/val_*.h5'\n/\n"
            "&model\n  layers = 'linear(16)', 'relu', 'linear(4)'\n/\n"
            "&train\n  epochs = 1, batch_size = 512, optimizer = 'sgd', lr = 0.05\n/\n"
            f"&io\n  checkpoint_every = 0\n/\n")
cg, v2 = make_cgroup()
print(f"memory cgroup {cg} ({'v2' if v2 else 'v1'})")
EPOCH = re.compile(r"^epoch 1/1 .*?(train_loss \S+\s+val_loss \S+\s+val_acc \S+)", re.M)


def run(name, overrides, limit_mib, small_shm=False):
    set_limit(cg, v2, limit_mib)
    kills = oom_kills(cg, v2)
    cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, nml,
           f"io.run_dir='{work}/run_{name}'", *overrides]
    if small_shm:
        cmd = ["unshare", "-m", "sh", "-c",
               'mount --make-rprivate / && mount -t tmpfs -o size=32m tmpfs /dev/shm && exec "$@"', "sh", *cmd]

    def enter():
        if limit_mib is not None:
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
                       preexec_fn=enter, stdin=subprocess.DEVNULL)
    out = "\n".join(l for l in p.stdout.splitlines() if not l.startswith("  "))  # the namelist echo
    print(f"--- {name} (limit {limit_mib} MiB): {' '.join(cmd)}\n{out}\n--- exit {p.returncode}")
    return p.returncode, p.stdout, oom_kills(cg, v2) - kills


def losses(name, out):
    m = EPOCH.findall(out)
    if len(m) != 1:
        fail(f"{name}: {len(m)} epoch lines")
    return m[0]


def ends_in_line(name, code, out, killed, held=None, want=None):
    if killed:
        fail(f"{name}: the kernel killed {killed} process(es) for memory")
    lines = [l for l in out.splitlines() if l.startswith("error:")]
    if code != 1 or len(lines) != 1:
        fail(f"{name}: exit {code}, error lines {lines}; expected exit 1 and one line")
    want = want or (f"data.mode = 'preload': the data need [0-9.]+ MiB on node \\S+ \\({held}\\) and [0-9.]+ MiB is "
                    f"free under the memory limit of cgroup \\S+ \\(memory\\.(limit_in_bytes|max) [0-9.]+ MiB\\): ask "
                    f"the batch system for more memory \\(sbatch --mem\\), set data\\.mode = 'stream'")
    if not re.search(want, lines[0]):
        fail(f"{name}: the line does not say what it needs and what there is: {lines[0]}")
    if "Killed" in out or "signal 9" in out:
        fail(f"{name}: a rank was killed")


try:
    code, out, _ = run("reference", ["data.mode='stream'"], None)
    if code != 0:
        fail(f"reference: exit {code}")
    ref = losses("reference", out)

    code, out, killed = run("shared", ["data.mode='preload'"], LIMIT_MIB)
    if code != 0 or killed:
        fail(f"1 shared: exit {code}, {killed} kill(s); one copy per node fits in {LIMIT_MIB} MiB")
    if "preloaded, one copy per node in shared memory" not in out:
        fail("1 shared: the data line does not say one copy per node")
    if losses("shared", out) != ref:
        fail(f"1 shared: {losses('shared', out)} against the streamed {ref}")

    code, out, killed = run("per_rank", ["data.mode='preload'", "data.preload_shared=F"], LIMIT_MIB)
    ends_in_line("2 per rank", code, out, killed, r"a copy on each of its 2 rank\(s\)")

    code, out, killed = run("auto", [], LIMIT_MIB)
    if code != 0 or killed:
        fail(f"3 auto: exit {code}, {killed} kill(s)")
    if not re.search(r"^data: streamed, not preloaded: the preload would take [0-9.]+ MiB on node \S+ \(one copy "
                     r"in shared memory for its 2 rank\(s\)\), more than half of the [0-9.]+ MiB free under the "
                     r"memory limit of cgroup", out, re.M):
        fail("3 auto: no line saying why the data is streamed")
    if losses("auto", out) != ref:
        fail(f"3 auto: {losses('auto', out)} against {ref}")

    code, out, killed = run("small", ["data.mode='preload'"], SMALL_MIB)
    ends_in_line("4 small", code, out, killed, r"one copy in shared memory for its 2 rank\(s\)")

    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs -o size=32m "
                            "tmpfs /dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"SKIP: cases 5 and 6 (a small /dev/shm): unshare -m cannot mount here: {probe.stderr.strip()}")
        sys.exit(SKIP)
    code, out, killed = run("small_shm", ["data.mode='preload'"], None, small_shm=True)
    if code != 0:
        fail(f"5 small /dev/shm: exit {code}")
    warnings = re.findall(r"^rank 0: warning: data: no shared memory for the preload, a copy on every rank instead "
                          r"\(data\.preload_shared\): rank 0 \(\S+\): /dev/shm has [0-9.]+ MiB free of 32\.0 MiB, "
                          r"[0-9.]+ MiB needed$", out, re.M)
    if len(warnings) != 1 or out.count("no shared memory") != 1:
        fail("5 small /dev/shm: not one warning naming /dev/shm's size")
    if "preloaded on every rank" not in out or losses("small_shm", out) != ref:
        fail("5 small /dev/shm: not preloaded on every rank with the reference's losses")

    code, out, killed = run("small_shm_limit", ["data.mode='preload'"], LIMIT_MIB, small_shm=True)
    ends_in_line("6 small /dev/shm under the limit", code, out, killed, r"a copy on each of its 2 rank\(s\)")

    code, out, killed = run("adamw", ["data.mode='stream'", "train.optimizer='adamw'",
                                      "model.layers='linear(4096)','relu','linear(1024)','relu','linear(4)'"],
                            LIMIT_MIB)
    ends_in_line("7 AdamW state", code, out, killed,
                 want=r"^error: the run needs [0-9.]+ MiB more on node \S+ than its 2 rank\(s\) hold now \(optimizer "
                      r"state 19[0-9.]+ MiB and activations [0-9.]+ MiB in all, as the memory line counts them\) and "
                      r"[0-9.]+ MiB is free under the memory limit of cgroup \S+ \(memory\.(limit_in_bytes|max) "
                      r"360\.0 MiB\): ask the batch system for more memory")
    print("PASS")
finally:
    set_limit(cg, v2, None)
    try:
        os.rmdir(cg)
    except OSError as e:
        print(f"note: {cg} not removed: {e}")
