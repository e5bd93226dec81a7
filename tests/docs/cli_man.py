#!/usr/bin/env python3
"""The man page the build wrote (ddp_train --man) renders, and documents every key.

usage: cli_man.py DDP_TRAIN MAN_PAGE

- `groff -man -ww -z` reads MAN_PAGE without a warning;
- rendered, it has the sections of a man page, each option of --help and each key
  of `ddp_train --keys --markdown` (type and default on the line after the key);
- MAN_PAGE is what DDP_TRAIN --man prints now (the build did not leave a stale one).
Exit 77 (skipped) without groff.
"""
import os
import re
import shutil
import subprocess
import sys

SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "INPUT KEYS", "EXIT STATUS", "ENVIRONMENT", "FILES",
            "SEE ALSO"]


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def main(exe, page):
    if not shutil.which("groff"):
        print("no groff (apt-get install groff-base): skipping")
        return 77
    with open(page, encoding="utf-8") as f:
        source = f.read()
    if source != run([exe, "--man"]).stdout:
        sys.exit(f"FAIL: {page} is not what {exe} --man prints: build the ddp_train_man target")

    warnings = run(["groff", "-man", "-Tutf8", "-ww", "-z", page]).stderr
    if warnings.strip():
        sys.exit(f"FAIL: groff warns about {page}:\n{warnings}")
    # Plain text: no bold or underline by overstriking (-P-c with -b -o -u).
    text = run(["groff", "-man", "-Tutf8", "-P-cbou", page]).stdout
    print("\n".join(text.splitlines()[:25]))
    headings = re.findall(r"^([A-Z][A-Z ]+)$", text, re.M)
    if headings != SECTIONS:
        sys.exit(f"FAIL: sections {headings}, expected {SECTIONS}")

    usage = run([exe, "--help"]).stdout
    options = re.findall(r"^  (\S+(?: \S+)*) {2,}\S", usage, re.M)  # "  --check   validate ..."
    keys = re.findall(r"^\| `([a-z]+\.[a-z_0-9]+)` \| ([^|]+) \|", run([exe, "--keys", "--markdown"]).stdout,
                      re.M)
    missing = [o for o in options if not re.search(r"^ {7}" + re.escape(o) + r"\b", text, re.M)]
    for key, type_ in keys:
        if not re.search(r"^ {7}" + re.escape(key) + r"\n +" + re.escape(type_.strip()) + r", ", text, re.M):
            missing.append(key)
    if len(options) < 10 or len(keys) < 40 or missing:
        sys.exit(f"FAIL: {len(options)} options and {len(keys)} keys; not in the man page as such: {missing}")
    print(f"{page}: no groff warnings; {len(options)} options and {len(keys)} keys, each in the page")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2])
    sys.exit(main(sys.argv[1], sys.argv[2]))
