"""Helpers for the checkpoint tests: run ddp_train under mpiexec, stop it with a
real SIGUSR1 (sent to mpiexec, which forwards it to the ranks), read checkpoints."""
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

EX_TEMPFAIL = 75


def mpirun(mpiexec, np_, binary, args):
    return [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", str(np_), binary] + list(args)


def run(cmd, env=None, timeout=600):
    """Runs to completion; returns (exit status, stdout, stderr), echoing both."""
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    print(f"exit status {p.returncode}", flush=True)
    return p.returncode, p.stdout, p.stderr


def children(pid):
    """The pids of pid's child processes (mpiexec's ranks, which it starts itself)."""
    kids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                # the field after the parenthesised command name is the state, then the ppid
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d))
        except (ValueError, OSError, IndexError):
            pass
    return kids


def send_stop(p):
    """SIGUSR1 to mpiexec, which forwards it to the ranks; with DDP_TEST_SIGNAL_RANKS=1
    to the ranks themselves, as Slurm's `scancel --signal=USR1` does (on a machine whose
    mpiexec does not forward the signal: an Open MPI 4.1.6 mixed with 4.1.4 did not)."""
    if os.environ.get("DDP_TEST_SIGNAL_RANKS") == "1":
        ranks = children(p.pid)
        for pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        print(f">>> sent SIGUSR1 to the ranks {ranks}", flush=True)
    else:
        p.send_signal(signal.SIGUSR1)
        print(">>> sent SIGUSR1 to mpiexec", flush=True)


def run_until(cmd, stop_when, timeout=600):
    """Runs cmd; sends SIGUSR1 (send_stop) when stop_when(line) is true for a line of
    its stdout. Returns (exit status, stdout text, whether the signal was sent)."""
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    out, sent = [], False
    deadline = time.time() + timeout
    for line in p.stdout:
        out.append(line)
        sys.stdout.write(line)
        if not sent and stop_when(line):
            send_stop(p)
            sent = True
        if time.time() > deadline:
            p.kill()
            break
    rc = p.wait()
    print(f"exit status {rc}", flush=True)
    return rc, "".join(out), sent


def progress_step(line, epoch):
    """Step of a progress line '  epoch E/N P%  step S ...' of epoch E, else None."""
    m = re.match(r"\s+epoch (\d+)/\d+ \d+%\s+step (\d+)\s", line)
    return int(m.group(2)) if m and int(m.group(1)) == epoch else None


def epoch_end_step(text, epoch):
    m = re.search(rf"^epoch {epoch}/\d+\s+step (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def state(path):
    with h5py.File(path, "r") as f:
        return {k: f["state"][k][()].item() for k in f["state"]}


def arrays(path, groups=("model", "optimizer")):
    """Every dataset of the given groups, by path."""
    out = {}
    with h5py.File(path, "r") as f:
        for g in groups:
            for k in f[g]:
                out[f"/{g}/{k}"] = f[g][k][()]
    return out


def bitwise_equal(a, b):
    """(equal, report) comparing two dicts of arrays bit for bit."""
    if sorted(a) != sorted(b):
        return False, f"different datasets: {sorted(a)} vs {sorted(b)}"
    worst = []
    for k in sorted(a):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        same = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        if not same:
            diff = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))) if x.shape == y.shape else "shape"
            worst.append(f"{k}: max |diff| {diff}")
    return not worst, ("; ".join(worst) if worst else f"{len(a)} datasets bitwise identical")


def latest(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
        return f.read().strip()


def checkpoints(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return sorted(n for n in os.listdir(d) if re.fullmatch(r"ckpt_\d{9}\.h5", n))


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def computed_checksum(path):
    """The checksum attribute as ddp_train computes it (src/io/checkpoint_format.cpp):
    FNV-1a 64 over every dataset's path (with its NUL) then its bytes, in path order."""
    datasets = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: datasets.append(("/" + name, np.asarray(obj[()]).tobytes()))
                     if isinstance(obj, h5py.Dataset) else None)
    h = 0xCBF29CE484222325
    for name, data in sorted(datasets):
        for byte in name.encode() + b"\0" + data:
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"fnv1a64:{h:016x}"


def stored_checksum(path):
    with h5py.File(path, "r") as f:
        return f.attrs["checksum"].decode()


def rewrite_checksum(path):
    """After editing a checkpoint with h5py: a checksum that matches the edit again."""
    value = computed_checksum(path).encode()
    with h5py.File(path, "r+") as f:
        f.attrs.create("checksum", value, dtype=h5py.string_dtype("ascii", len(value)))


def expect_one_error(rc, out, err, pattern):
    """A collective error: non-zero exit, exactly one line 'error: ...' matching pattern,
    no MPI_Abort banner (the ranks left through MPI_Finalize). Returns the line."""
    lines = [l for l in (out + err).splitlines() if l.startswith("error:")]
    if rc == 0 or len(lines) != 1 or not re.search(pattern, lines[0]):
        fail(f"expected exit != 0 and one line 'error: ...' matching /{pattern}/; got exit {rc}, lines {lines}")
    if re.search(r"MPI_ABORT was invoked|ORTE_ERROR_LOG|called MPI_Abort", out + err):
        fail("MPI_Abort for an error every rank found: expected MPI_Finalize")
    return lines[0]
