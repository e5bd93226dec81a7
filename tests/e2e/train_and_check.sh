#!/usr/bin/env bash
# usage: train_and_check.sh RUN_DIR "CHECK_METRICS ARGS" -- COMMAND...
# Runs a training command into a fresh RUN_DIR, then checks its metrics.jsonl.
set -eu
run_dir=$1
check=$2
shift 3
rm -rf "$run_dir"
timeout 900 "$@"
# shellcheck disable=SC2086
"${DDP_PYTHON:-python3}" "$(dirname "$0")/check_metrics.py" "$run_dir" $check
