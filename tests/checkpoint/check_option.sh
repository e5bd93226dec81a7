#!/usr/bin/env bash
# usage: check_option.sh RUN_DIR -- COMMAND...   (COMMAND runs ddp_train --check)
# --check exits 0 with "check passed", trains nothing and creates no run directory.
set -u
run_dir=$1
shift 2
rm -rf "$run_dir"
out=$("$@" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
grep -q "^check passed$" <<<"$out" || { echo "FAIL: no 'check passed'"; exit 1; }
grep -q "total parameters" <<<"$out" || { echo "FAIL: no model summary"; exit 1; }
grep -q "^epoch " <<<"$out" && { echo "FAIL: it trained"; exit 1; }
[ -e "$run_dir" ] && { echo "FAIL: it created $run_dir"; exit 1; }
echo PASS
