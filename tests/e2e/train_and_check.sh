#!/usr/bin/env bash
# usage: train_and_check.sh RUN_DIR "CHECK_METRICS ARGS" -- COMMAND...
# Runs a training command into a fresh RUN_DIR, then checks its metrics.jsonl.
# DDP_EXPECT_LOG=REGEX (optional): the run's output must also hold a line matching it.
set -eu -o pipefail
run_dir=$1
check=$2
shift 3
rm -rf "$run_dir" "$run_dir.log"
mkdir -p "$(dirname "$run_dir")"
timeout 900 "$@" 2>&1 | tee "$run_dir.log"
if [ -n "${DDP_EXPECT_LOG:-}" ] && ! grep -Eq "$DDP_EXPECT_LOG" "$run_dir.log"; then
  echo "FAILED: no line of the run's output matches '$DDP_EXPECT_LOG'" >&2
  exit 1
fi
# shellcheck disable=SC2086
"${DDP_PYTHON:-python3}" "$(dirname "$0")/check_metrics.py" "$run_dir" $check
