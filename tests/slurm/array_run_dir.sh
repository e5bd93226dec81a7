#!/usr/bin/env bash
# usage: array_run_dir.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# A job array whose tasks are given one input file, as users do by mistake:
# `sbatch --array=0-1 -n 1 jobs/cpu.sbatch tiny.nml io.run_dir=R`, both tasks at once
# on the 2-CPU node (each step slowed by 0.2 s). The task that locks R first trains
# to its end (COMPLETED, metrics.jsonl with its 3 epochs); the other ends at start-up,
# FAILED, in one line naming the first by its pid and its Slurm job <array>_<task>.
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

out=slurm_runs/array
rm -rf "$out"
mkdir -p "$out"
export DDP_TRAIN_BIN=$ddp_train DDP_TEST_STEP_DELAY_US=200000
run=$out/run
id=$(submit --array=0-1 -n 1 --job-name=ddp_array --output="$out/job-%A_%a.out" "$jobs/cpu.sbatch" \
     "$e2e/tiny.nml" train.epochs=3 io.run_dir=$run)
echo "submitted array $id: sbatch --array=0-1 -n 1 $jobs/cpu.sbatch $e2e/tiny.nml train.epochs=3 io.run_dir=$run"
declare -A state
for task in 0 1; do
  state[$task]=$(wait_final "${id}_$task" 180) || true
  echo "task $task: JobState=${state[$task]} ExitCode=$(job_field "${id}_$task" ExitCode)"
done
if [ "${state[0]}_${state[1]}" = COMPLETED_FAILED ]; then
  won=0 lost=1
elif [ "${state[0]}_${state[1]}" = FAILED_COMPLETED ]; then
  won=1 lost=0
else
  for task in 0 1; do show_job "${id}_$task" "$out/job-${id}_$task.out"; done
  echo "FAIL: expected one task COMPLETED and the other FAILED"
  exit 1
fi
log=$out/job-${id}_$lost.out
cat "$log"
lines=$(grep -c "^error: " "$log" || true)
re="^error: io\.run_dir '$run' is in use by another run of ddp_train \(pid [0-9]+ on [^,]+, Slurm job ${id}_$won, since [0-9-]+ [0-9:]+ UTC, input $e2e/tiny\.nml; it holds the lock on $run/ddp_train\.lock\): two runs in one directory would write over each other's checkpoints and metrics; give this run an io\.run_dir of its own, or start it when that run has ended$"
if [ "$lines" != 1 ] || ! grep -Eq "$re" "$log"; then
  echo "FAIL: task $lost's output should hold one error line naming task $won (Slurm job ${id}_$won): /$re/"
  exit 1
fi
if grep -q "^epoch " "$log"; then
  echo "FAIL: task $lost trained"
  exit 1
fi
"$python" "$e2e/check_metrics.py" "$run" --epochs 3 --world-size 1
echo "PASS: task $won trained, task $lost refused naming Slurm job ${id}_$won"
