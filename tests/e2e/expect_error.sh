#!/usr/bin/env bash
# usage: expect_error.sh REGEX -- COMMAND...
# Passes when COMMAND fails (non-zero exit) within 60 s, its output matches the
# extended REGEX, and it printed exactly one line starting with "error:" (the
# user sees the problem once, not once per rank).
set -u
regex=$1
shift 2
out=$(timeout 60 "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "--- exit status $rc"
if [ $rc -eq 124 ]; then echo "FAIL: timed out (a hang)"; exit 1; fi
if [ $rc -eq 0 ]; then echo "FAIL: exited 0"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "FAIL: output does not match /$regex/"; exit 1; fi
n=$(grep -c '^error:' <<<"$out")
if [ "$n" -ne 1 ]; then echo "FAIL: $n lines start with 'error:', expected 1"; exit 1; fi
echo "PASS"
