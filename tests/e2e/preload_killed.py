#!/usr/bin/env python3
"""A rank killed while it makes its node's shared copy of a preload leaves no memory
behind in /dev/shm. DDP_INJECT_FAULT=kill_shared_memory@rank0 SIGKILLs rank 0 (the
node's first rank) right after its posix_fallocate has reserved the copy's memory,
as the kernel's out-of-memory killer would in that call. /dev/shm memory outlives
the processes that made it while a name points at it, until someone removes the
name or the node reboots; the name is removed before the memory is reserved, so:
  - the job ends (mpirun sees rank 0 killed), within the timeout;
  - rank 0 said which pid it was, and /dev/shm holds no ddp_train.<pid>.* object.

usage: preload_killed.py MPIEXEC DDP_TRAIN INPUT.nml RUN_DIR
"""
import os
import re
import subprocess
import sys

mpiexec, binary, nml, run_dir = sys.argv[1:5]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary, nml, "data.mode='preload'",
       f"io.run_dir='{run_dir}'"]
env = dict(os.environ, DDP_INJECT_FAULT="kill_shared_memory@rank0")
p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=90)
print(f"$ DDP_INJECT_FAULT=kill_shared_memory@rank0 {' '.join(cmd)}\n--- standard error\n{p.stderr}--- exit "
      f"{p.returncode}")
m = re.search(r"^rank 0 \(pid (\d+)\): DDP_INJECT_FAULT: killed$", p.stderr, re.M)
if not m:
    fail("rank 0 did not say it was killed in the making of the shared memory")
if p.returncode == 0:
    fail("the job ended 0 with rank 0 killed")
left = [f for f in os.listdir("/dev/shm") if f.startswith(f"ddp_train.{m.group(1)}.")]
if left:
    sizes = [os.stat(os.path.join("/dev/shm", f)).st_blocks * 512 for f in left]
    for f in left:
        os.unlink(os.path.join("/dev/shm", f))
    fail(f"/dev/shm holds {left} ({sizes} bytes reserved) after rank 0 was killed")
print(f"PASS: rank 0 (pid {m.group(1)}) killed, exit {p.returncode}, nothing of it in /dev/shm")
