"""The tools tests' checks: check() prints `ok:` or `FAILED:` and the thing checked,
and counts the failures; finish() prints the verdict line ctest matches
("NAME: all passed" or "NAME: N FAILED") and exits 1 on any failure."""
import sys

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        failures.append(what)


def finish(name):
    print(f"{name}: " + ("all passed" if not failures else f"{len(failures)} FAILED"))
    sys.exit(1 if failures else 0)
