#!/usr/bin/env python3
"""Checkpoints on a file system slow to write and read: the run directory on a real
ext4 on a loop device whose writes or reads the kernel holds to a set rate (the
block I/O controller's throttle), 2 ranks, comm.timeout_s = 5, a checkpoint of
32 MiB (the tiny set with a wide model, whose middle layer is one dataset of
16 MiB).

1. Writes at 2 MiB/s: the checkpoint takes about 16 s to reach the disk, three
   times the timeout, and moves on every 2 s (a run of 4 MiB written back): the
   other rank waits for it, and the run ends 0 with its checkpoint. Rank 0 used to
   write the file into the page cache and then fsync it whole, 16 s in one call
   that said nothing, and the other rank's watchdog ended the healthy job naming
   rank 0.
2. Reads at 2 MiB/s, the file system mounted again (its cached pages gone): the
   next start resumes from that checkpoint, read in pieces of 4 MiB; one read of
   the 16 MiB dataset took 8 s and the job ended the same way at start-up.
3. Writes at 256 KiB/s: a run of 4 MiB takes 16 s, rank 0 has not moved on within
   the timeout, and the job ends in one line naming it `(in a checkpoint at step
   N)`, not a hang. The throttle is lifted then (rank 0 waits for its writes in
   the kernel, where a kill waits too), and the job ends.
4. At full speed again, the same command trains: the temp file the killed writer
   left is removed, the checkpoint written.
5. io.checkpoint_async = T, writes at 8 MiB/s, steps paced to 1 s (5 a epoch), 3
   epochs: each of the first two checkpoints takes about 4 s to write, on rank 0's
   thread, while the ranks train the next epoch: the line saying it is on disk
   comes after that epoch's first steps. The last is on disk before the run ends
   (`latest`); each checkpoint written in the background resumes.

Needs root for losetup, mount and the throttle (cgroup v1's
blkio.throttle.write_bps_device): skipped (exit 77) with the reason where it
cannot have them.

usage: slow_disk.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from common import checkpoints, fail, latest, mpirun, progress_step, run

mpiexec, binary, nml, run_dir = sys.argv[1:5]
base = os.path.abspath(run_dir)
image, mnt = base + "_slow.img", base + "_slowfs"
throttle = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"
timeout_s = 5
args = [nml, "train.log_every=0", f"io.run_dir={mnt}/run", "train.epochs=1", f"comm.timeout_s={timeout_s}",
        "model.layers=linear(2048),relu,linear(2048),relu,linear(3)"]


def tool(name):
    return shutil.which(name) or next((d + name for d in ("/usr/sbin/", "/sbin/") if os.path.exists(d + name)), name)


def sh(*cmd):
    return subprocess.run([tool(cmd[0])] + list(cmd[1:]), capture_output=True, text=True)


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def release():
    """Takes away what this test or an earlier run of it left: mount, loop device,
    image. A rank killed while it waited for its writes in the kernel ends when they
    are done (the throttle lifted): the mount is busy until then."""
    for _ in range(60):
        if sh("umount", mnt).returncode == 0 or not os.path.ismount(mnt):
            break
        time.sleep(1)
    for line in sh("losetup", "-j", image).stdout.splitlines():  # "/dev/loop3: [..]:.. (image)"
        sh("losetup", "-d", line.split(":")[0])
    if os.path.exists(image):
        os.remove(image)


def set_rate(device, bytes_per_s, what="write"):
    """0: no limit."""
    with open(throttle.replace("write", what), "w") as f:
        f.write(f"{device} {bytes_per_s}\n")


def timed_write(path, n):
    """Seconds to write n bytes and fsync them."""
    t0 = time.monotonic()
    with open(path, "wb") as f:
        f.write(os.urandom(n))
        f.flush()
        os.fsync(f.fileno())
    return time.monotonic() - t0


if not os.path.exists(throttle):
    skip(f"no block I/O throttle here ({throttle}: cgroup v1's blkio controller)")
release()
shutil.rmtree(run_dir, ignore_errors=True)
os.makedirs(mnt, exist_ok=True)
with open(image, "wb") as f:
    f.truncate(256 << 20)
p = sh("losetup", "--find", "--show", image)
if p.returncode != 0:
    os.remove(image)
    skip(f"cannot attach a loop device: {p.stderr.strip()}")
loop = p.stdout.strip()
device = None
try:
    # Inode tables and journal written now, not by ext4lazyinit against the throttle later.
    p = sh("mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
    if p.returncode != 0:
        skip(f"mkfs.ext4 {loop}: {p.stderr.strip()}")
    p = sh("mount", loop, mnt)
    if p.returncode != 0:
        skip(f"cannot mount {loop} on {mnt}: {p.stderr.strip()}")
    st = os.stat(loop)
    device = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"

    # The throttle holds: 4 MiB at 2 MiB/s take about 2 s.
    set_rate(device, 2 << 20)
    took = timed_write(os.path.join(mnt, "probe"), 4 << 20)
    os.remove(os.path.join(mnt, "probe"))
    print(f"{loop} ({device}) on {mnt}, writes held to 2 MiB/s: 4 MiB and fsync took {took:.1f} s", flush=True)
    if took < 1.5:
        fail(f"the throttle does not hold: 4 MiB at 2 MiB/s were on disk in {took:.1f} s")

    # 1. Slow, moving on: waited for.
    t0 = time.monotonic()
    rc, out, err = run(mpirun(mpiexec, 2, binary, args), timeout=300)
    took = time.monotonic() - t0
    ckpt = os.path.join(mnt, "run", "checkpoints", "ckpt_000000005.h5")
    size = os.path.getsize(ckpt) if os.path.exists(ckpt) else 0
    if rc != 0 or "hang:" in out + err or not size or latest(os.path.join(mnt, "run")) != "ckpt_000000005.h5":
        fail(f"1. at 2 MiB/s: exit {rc}, checkpoint of {size} bytes (expected exit 0, no watchdog line, "
             "ckpt_000000005.h5 written and latest)")
    if took < size / (2 << 20) * 0.75 or took < 2 * timeout_s:
        fail(f"1. the run took {took:.1f} s for a checkpoint of {size} bytes at 2 MiB/s: the disk was not slow")
    print(f"1. a checkpoint of {size} bytes at 2 MiB/s: the run took {took:.1f} s "
          f"(comm.timeout_s = {timeout_s}), exit 0", flush=True)

    # 2. Slow reads, at start-up: waited for.
    set_rate(device, 0)
    if sh("umount", mnt).returncode != 0 or sh("mount", loop, mnt).returncode != 0:
        fail(f"cannot mount {loop} on {mnt} again")
    set_rate(device, 2 << 20, "read")
    t0 = time.monotonic()
    rc, out, err = run(mpirun(mpiexec, 2, binary, args + ["train.epochs=2"]), timeout=300)
    took = time.monotonic() - t0
    set_rate(device, 0, "read")
    if rc != 0 or "hang:" in out + err or f"resumed from {ckpt} at epoch 2 step 5" not in out:
        fail(f"2. reads at 2 MiB/s: exit {rc} (expected 0, 'resumed from {ckpt} at epoch 2 step 5', "
             "no watchdog line)")
    if took < size / (2 << 20) * 0.75:
        fail(f"2. the run took {took:.1f} s to read a checkpoint of {size} bytes at 2 MiB/s: the disk was not slow")
    print(f"2. reads at 2 MiB/s: resumed from it, the run took {took:.1f} s, exit 0", flush=True)

    # 3. Slower than a run of 4 MiB per comm.timeout_s: rank 0 named, then the job ends.
    shutil.rmtree(os.path.join(mnt, "run"))
    set_rate(device, 256 << 10)
    cmd = mpirun(mpiexec, 2, binary, args)
    print("$ " + " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    named = threading.Event()
    lines = []

    def read(stream):
        for line in stream:
            lines.append(line)
            sys.stdout.write(line)
            if "hang:" in line:
                named.set()

    readers = [threading.Thread(target=read, args=(s,)) for s in (job.stdout, job.stderr)]
    for r in readers:
        r.start()
    t0 = time.monotonic()
    seen = named.wait(120)
    waited = time.monotonic() - t0
    set_rate(device, 0)  # rank 0's writes done, so that its kill can end it
    try:
        rc = job.wait(60)
    except subprocess.TimeoutExpired:
        job.kill()
        rc = job.wait()
        fail("3. the job did not end within 60 s of the watchdog's line and the throttle lifted")
    for r in readers:
        r.join()
    print(f"exit status {rc}", flush=True)
    hangs = [l.strip() for l in lines if "hang:" in l]
    pattern = (rf"^rank 1 \([^)]*\): hang: waited [0-9]+ s \(comm.timeout_s = {timeout_s}\) in .* at step 5; "
               r"not arrived: rank 0 \(in a checkpoint at step 5\); waiting: rank 1$")
    if not seen or rc == 0 or len(hangs) != 1 or not re.match(pattern, hangs[0]):
        fail(f"3. at 256 KiB/s: expected one line matching /{pattern}/ and exit != 0; got {hangs}, exit {rc}")
    print(f"3. at 256 KiB/s rank 0 named {waited:.0f} s into the run, in one line; exit {rc}", flush=True)

    # 4. Full speed: trains, the killed writer's temp file gone.
    rc, out, err = run(mpirun(mpiexec, 2, binary, args), timeout=120)
    if rc != 0 or checkpoints(os.path.join(mnt, "run")) != ["ckpt_000000005.h5"] or \
            sorted(os.listdir(os.path.join(mnt, "run", "checkpoints"))) != ["ckpt_000000005.h5", "latest"]:
        fail(f"4. at full speed: exit {rc}, checkpoints dir {os.listdir(os.path.join(mnt, 'run', 'checkpoints'))}")
    print("4. at full speed: exit 0, ckpt_000000005.h5 and latest alone in checkpoints/")

    # 5. Written in the background while the ranks train on.
    shutil.rmtree(os.path.join(mnt, "run"))
    set_rate(device, 8 << 20)
    env = dict(os.environ, DDP_TEST_STEP_DELAY_US="1000000")
    async_args = [a for a in args if a not in ("train.epochs=1", "train.log_every=0")]
    t0 = time.monotonic()
    rc, out, err = run(mpirun(mpiexec, 2, binary, async_args + ["train.epochs=3", "train.log_every=1",
                                                                "io.checkpoint_async=T"]), env=env, timeout=300)
    took = time.monotonic() - t0
    set_rate(device, 0)
    lines = out.splitlines()
    run_ckpts = os.path.join(mnt, "run", "checkpoints")
    for step, epoch in ((5, 2), (10, 3)):
        name = f"ckpt_{step:09d}.h5"
        on_disk = [i for i, l in enumerate(lines)
                   if re.match(rf"^checkpoint {re.escape(os.path.join(run_ckpts, name))} on disk \([0-9.]+ MB in "
                               r"[0-9.]+ s, written while the ranks trained on: io.checkpoint_async\)$", l)]
        trained = [i for i, l in enumerate(lines) if progress_step(l, epoch) == step + 1]
        if len(on_disk) != 1 or not trained or on_disk[0] < trained[0]:
            fail(f"5. {name}: expected one line saying it is on disk, after the progress line of step {step + 1}; "
                 f"line numbers {on_disk}, step {step + 1} at {trained}")
    if rc != 0 or "hang:" in out + err or latest(os.path.join(mnt, "run")) != "ckpt_000000015.h5":
        fail(f"5. in the background: exit {rc} (expected 0, no watchdog line, ckpt_000000015.h5 the latest)")
    for step, epoch in ((5, 1), (10, 2)):
        ckpt = os.path.join(run_ckpts, f"ckpt_{step:09d}.h5")
        rc, out, err = run(mpirun(mpiexec, 2, binary, args[:1] + [f"io.run_dir={mnt}/verify", f"io.resume={ckpt}",
                                                                  f"train.epochs={epoch + 1}"] + args[4:]),
                           timeout=120)
        if rc != 0 or f"resumed from {ckpt} at epoch {epoch + 1} step {step}" not in out:
            fail(f"5. {ckpt} written in the background does not resume: exit {rc}")
    print(f"5. io.checkpoint_async: the run took {took:.1f} s; ckpt 5 and 10 on disk while the next epoch "
          "trained, each resumes; ckpt 15 the latest at the end")
    print("PASS")
finally:
    if device:
        set_rate(device, 0)
        set_rate(device, 0, "read")
    release()
