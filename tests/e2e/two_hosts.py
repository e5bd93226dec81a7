#!/usr/bin/env python3
"""ddp_train on 2 hosts of 1 rank each, made of this machine's network namespaces,
gives bit for bit the single-host 2-rank run.

Host A and host B are two network namespaces joined by a veth pair (10.213.0.1/24 in
A, 10.213.0.2/24 in B, loopback up in each, no other interface: every byte between
them crosses the veth). mpirun runs inside A with `--host 10.213.0.1:1,10.213.0.2:1`,
Open MPI's TCP transport on that link only (btl tcp,self; btl and oob
tcp_if_include), and an ssh-free launcher: plm_rsh_agent = netns_agent.sh, which
starts B's orted with `ip netns exec`. Checked:
  - the launch really went through the agent to B (its log), and rank 0 ran in A's
    namespace, rank 1 in B's (each rank prints its /proc/self/ns/net, then execs
    ddp_train);
  - the MPI traffic crossed the veth (its byte counters);
  - the final checkpoint's /model and /optimizer datasets are bitwise those of the
    same run on 2 ranks of one host (plain mpirun, shared memory), and so are the
    metrics' losses.
Both hosts share the filesystem: binary, data and run_dir are the same paths.
Everything is under a timeout; the namespaces (named with this process's id, so
concurrent runs do not collide) and what runs in them go at the end, on failure too.
Exits 77 (skip) where network namespaces cannot be made (no CAP_SYS_ADMIN, no `ip`).

usage: two_hosts.py MPIEXEC DDP_TRAIN INPUT.nml RUN_PREFIX [group.key=value ...]
         [--two-hosts-only group.key=value ...] [--agent AGENT]
The overrides go to both runs; --two-hosts-only ones to the 2-host run alone, and
--agent replaces netns_agent.sh: both are there to see the test fail.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
from common import arrays, bitwise_equal, fail, latest, run  # noqa: E402

SKIP = 77
RUN_TIMEOUT_S = 60
SUBNET = "10.213.0.0/24"  # the same in every pair: each pair's link is its own
HOSTS = {"a": ("10.213.0.1", "ddp0"), "b": ("10.213.0.2", "ddp1")}

parser = argparse.ArgumentParser()
parser.add_argument("mpiexec")
parser.add_argument("binary")
parser.add_argument("nml")
parser.add_argument("prefix")
parser.add_argument("overrides", nargs="*")
parser.add_argument("--two-hosts-only", nargs="*", default=[])
parser.add_argument("--agent", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_agent.sh"))
args = parser.parse_args()

tag = f"ddp2h{os.getpid()}"
ns = {h: tag + h for h in HOSTS}


def ip(*argv, check=True):
    p = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        fail(f"ip {' '.join(argv)}: {p.stderr.strip()}")
    return p


def remove_namespace(name):
    """Kills what still runs in the namespace (only this test's processes live in it),
    then deletes it; its end of the veth goes with it."""
    pids = ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    ip("netns", "del", name, check=False)


def remove_stale():
    """Namespaces of earlier runs of this test that were killed before their cleanup
    (CTest's timeout sends SIGKILL): their creator's process id is gone. None without
    `ip` (make_hosts skips then)."""
    if shutil.which("ip") is None:
        return
    for line in ip("netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(ddp2h(\d+)[ab])\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            print(f"removing stale namespace {m.group(1)}", flush=True)
            remove_namespace(m.group(1))


def cleanup(*_):
    for name in ns.values():
        remove_namespace(name)


def on_signal(signum, _frame):
    sys.exit(f"FAIL: signal {signum}")  # leaves through `finally`: cleanup()


def make_hosts():
    if shutil.which("ip") is None:
        print("SKIP: no `ip` command (Debian's iproute2)", flush=True)
        sys.exit(SKIP)
    p = ip("netns", "add", ns["a"], check=False)
    if p.returncode != 0:
        print(f"SKIP: cannot make a network namespace here: {p.stderr.strip()}", flush=True)
        sys.exit(SKIP)
    ip("netns", "add", ns["b"])
    (addr_a, dev_a), (addr_b, dev_b) = HOSTS["a"], HOSTS["b"]
    # Made inside the namespaces: the veth's names never meet another pair's.
    ip("link", "add", dev_a, "netns", ns["a"], "type", "veth", "peer", "name", dev_b, "netns", ns["b"])
    for h, (addr, dev) in HOSTS.items():
        ip("-n", ns[h], "addr", "add", addr + "/24", "dev", dev)
        ip("-n", ns[h], "link", "set", "lo", "up")
        ip("-n", ns[h], "link", "set", dev, "up")
        links = ip("-n", ns[h], "-o", "link", "show").stdout
        names = sorted(re.findall(r"^\d+: ([^:@]+)", links, re.M))
        if names != sorted(["lo", dev]):
            fail(f"namespace {ns[h]} has interfaces {names}, expected lo and {dev} only")
    print(f"hosts: {ns['a']} {addr_a} ({dev_a}) <-> {ns['b']} {addr_b} ({dev_b})", flush=True)


def netns_id(name):
    return subprocess.run(["ip", "netns", "exec", name, "readlink", "/proc/self/ns/net"], capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()


def veth_bytes(h):
    stats = json.loads(ip("-n", ns[h], "-s", "-j", "link", "show", HOSTS[h][1]).stdout)[0]["stats64"]
    return stats["rx"]["bytes"], stats["tx"]["bytes"]


def final_checkpoint(run_dir):
    return os.path.join(run_dir, "checkpoints", latest(run_dir))


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run_or_fail(cmd, what, env=None):
    try:
        rc, out, err = run(cmd, env=env, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fail(f"{what}: no end after {RUN_TIMEOUT_S} s")
    if rc != 0:
        fail(f"{what}: exit status {rc}")
    return out + err


def main():
    one, two = args.prefix + "_one_host", args.prefix + "_two_hosts"
    for d in (one, two):
        shutil.rmtree(d, ignore_errors=True)
    binary, cwd = os.path.abspath(args.binary), os.getcwd()
    common = [args.nml] + args.overrides

    make_hosts()  # first: it is what skips
    # The reference: 2 ranks on this host, as every other 2-rank test runs them.
    run_or_fail([args.mpiexec, "--oversubscribe", "--allow-run-as-root", "-n", "2", binary] + common
                + [f"io.run_dir={one}"], "single-host run")

    log = os.path.abspath(args.prefix + "_agent.log")
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, DDP_NETNS_HOSTS=" ".join(f"{HOSTS[h][0]}={ns[h]}" for h in HOSTS), DDP_NETNS_LOG=log,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    before = veth_bytes("b")
    # Each rank names its namespace, then becomes ddp_train (same process).
    whereami = 'echo "rank $OMPI_COMM_WORLD_RANK netns $(readlink /proc/self/ns/net)"; exec "$0" "$@"'
    out = run_or_fail(["ip", "netns", "exec", ns["a"], args.mpiexec, "--allow-run-as-root",
                       "-n", "2", "--host", ",".join(f"{HOSTS[h][0]}:1" for h in HOSTS),
                       "--mca", "plm_rsh_agent", args.agent,
                       "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET,
                       "--mca", "oob_tcp_if_include", SUBNET, "-wdir", cwd,
                       "/bin/sh", "-c", whereami, binary] + common + args.two_hosts_only + [f"io.run_dir={two}"],
                      "2-host run", env=env)
    after = veth_bytes("b")

    # Where the ranks ran.
    launches = open(log).read().splitlines() if os.path.exists(log) else []
    print(f"agent log: {launches}", flush=True)
    addr_b = HOSTS["b"][0]
    if len(launches) != 1 or not re.match(rf"launch host={re.escape(addr_b)} netns={ns['b']}: .*\borted\b",
                                          launches[0]):
        fail(f"expected one orted launched through the agent on {addr_b} in {ns['b']}")
    where = dict(re.findall(r"^rank (\d+) netns (\S+)$", out, re.M))
    expected = {"0": netns_id(ns["a"]), "1": netns_id(ns["b"])}
    print(f"ranks' namespaces: {where}, expected {expected}", flush=True)
    if where != expected:
        fail("rank 0 must run in host A's namespace and rank 1 in host B's")
    rx, tx = after[0] - before[0], after[1] - before[1]
    print(f"veth of host B during the run: {rx} bytes in, {tx} bytes out", flush=True)
    if rx == 0 or tx == 0:
        fail("no traffic crossed the veth")

    # What they computed.
    a_path, b_path = final_checkpoint(one), final_checkpoint(two)
    if os.path.basename(a_path) != os.path.basename(b_path):
        fail(f"final checkpoints of different steps: {a_path} {b_path}")
    same, report = bitwise_equal(arrays(a_path), arrays(b_path))
    print(f"final checkpoints {a_path} vs {b_path}: {report}", flush=True)
    if not same:
        fail("the 2-host run's parameters or optimizer state differ from the single-host run's")
    ma, mb = metrics(one), metrics(two)
    keys = ("epoch", "step", "train_loss", "val_loss", "val_acc", "world_size")
    if [[r.get(k) for k in keys] for r in ma] != [[r.get(k) for k in keys] for r in mb]:
        fail(f"metrics differ: {ma} vs {mb}")
    print(f"metrics equal over {len(ma)} epochs ({', '.join(keys)})")
    print("PASS", flush=True)


for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)
remove_stale()
try:
    main()
finally:
    cleanup()
