#!/usr/bin/env python3
"""ddp_train's informational options, run as a user would: alone, without mpirun.

usage: cli_help.py DDP_TRAIN MPIEXEC [MPIEXEC_ARGS ...]

- --help: exit 0, the first line is ddp_train's usage, every option of the usage
  line is explained, and nothing of Kokkos's banner is printed;
- --kokkos-help: Kokkos's own options;
- --version: exit 0, "ddp_train <version>" first;
- --keys and --keys --markdown: every key once, in both, and the same keys;
- a bad option, or --markdown alone: exit 1 with one `error:` line that says what to do;
- under MPIEXEC on 2 ranks, --keys and --kokkos-help are printed once (rank 0).
"""
import os
import re
import subprocess
import sys

KOKKOS_BANNER = "Kokkos command line arguments"


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    print(f"$ {' '.join(cmd)}  (exit {p.returncode}, {len(p.stdout.splitlines())} lines)")
    return p


def fail(msg, p=None):
    if p is not None:
        print("--- stdout\n" + p.stdout + "--- stderr\n" + p.stderr)
    sys.exit("FAIL: " + msg)


def main(exe, mpiexec):
    p = run([exe, "--help"])
    if p.returncode != 0:
        fail("--help exited non-zero", p)
    lines = p.stdout.splitlines()
    if not lines or not lines[0].startswith("usage: ddp_train"):
        fail("--help: the first line is not ddp_train's usage", p)
    if KOKKOS_BANNER in p.stdout + p.stderr or "-" * 40 in p.stdout:
        fail("--help prints Kokkos's banner", p)
    print("\n".join(lines[:2]))
    for option in ["--check", "--trace", "--keys", "--keys --markdown", "--man", "--kokkos-help", "--version"]:
        if not re.search(r"^  " + re.escape(option) + r"(  |$)", p.stdout, re.M):
            fail(f"--help explains no {option}", p)
    if run([exe, "-h"]).stdout != p.stdout:
        fail("-h and --help differ")

    p = run([exe, "--kokkos-help"])
    if p.returncode != 0 or KOKKOS_BANNER not in p.stdout or "--kokkos-help" not in p.stdout:
        fail("--kokkos-help does not print Kokkos's options", p)

    p = run([exe, "--version"])
    if p.returncode != 0 or not p.stdout.startswith("ddp_train "):
        fail("--version", p)

    text = run([exe, "--keys"])
    markdown = run([exe, "--keys", "--markdown"])
    if text.returncode != 0 or markdown.returncode != 0:
        fail("--keys", text if text.returncode else markdown)
    text_keys = re.findall(r"^([a-z]+\.[a-z_0-9]+)  ", text.stdout, re.M)
    md_keys = re.findall(r"^\| `([a-z]+\.[a-z_0-9]+)` \|", markdown.stdout, re.M)
    if len(text_keys) < 40 or text_keys != md_keys or len(set(text_keys)) != len(text_keys):
        fail(f"--keys lists {len(text_keys)} keys, --keys --markdown {len(md_keys)}: expected the same, each once")
    for key, line in [("train.lr", r"^train\.lr +real +0\.01 +> 0$"), ("train.optimizer", r"^ +one of 'sgd', 'adamw'$")]:
        if not re.search(line, text.stdout, re.M):
            fail(f"--keys: {key} is not shown as /{line}/", text)
    print(f"{len(text_keys)} keys, {text_keys[0]} ... {text_keys[-1]}")

    for args, expected in [(["--frobnicate"], "error: unknown option '--frobnicate' (ddp_train --help lists"),
                           (["--markdown"], "error: --markdown goes with --keys")]:
        p = run([exe] + args)
        err = [l for l in p.stderr.splitlines() if l.strip()]
        if p.returncode != 1 or len(err) != 1 or not err[0].startswith(expected):
            fail(f"{' '.join(args)}: expected exit 1 and one line '{expected}...'", p)
        print(err[0])

    for args, marker in [(["--keys"], "KEY "), (["--kokkos-help"], KOKKOS_BANNER)]:
        p = run(mpiexec + [exe] + args)
        n = p.stdout.count(marker)
        if p.returncode != 0 or n != 1:
            fail(f"{' '.join(args)} on 2 ranks: '{marker}' {n} times, expected once (rank 0)", p)
    print("PASS")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2])
    main(sys.argv[1], sys.argv[2:])
