#!/usr/bin/env bash
# usage: cpu_job.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# `sbatch -n 2 jobs/cpu.sbatch tiny.nml ...` on the private Slurm: the job runs
# `srun ddp_train` with 2 tasks (PMIx) to completion; metrics.jsonl says
# world_size 2; the job ends COMPLETED with exit code 0. Then one task of 2 CPUs
# (sbatch -n 1 -c 2): the task, as it reads itself (lib.sh's task_probe), may run on
# 2 cores with OMP_NUM_THREADS=2. Then the template without an input file: the job
# fails at once with a clear message.
# Runs in the test directory, which holds e2e_data/ (fixture e2e_data).
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

out=slurm_runs/cpu
rm -rf "$out"
mkdir -p "$out"
export DDP_TRAIN_BIN=$ddp_train
id=$(submit -n 2 --job-name=ddp_cpu --output="$out/job-%j.out" "$jobs/cpu.sbatch" \
     "$e2e/tiny.nml" train.epochs=3 io.run_dir=$out/run)
echo "submitted job $id: sbatch -n 2 $jobs/cpu.sbatch $e2e/tiny.nml train.epochs=3 io.run_dir=$out/run"
state=$(wait_final "$id" 120) || true
log=$out/job-$id.out
echo "job $id: JobState=$state ExitCode=$(job_field "$id" ExitCode) NumTasks=$(job_field "$id" NumTasks)"
if [ "$state" != COMPLETED ] || [ "$(job_field "$id" ExitCode)" != 0:0 ]; then
  show_job "$id" "$log"
  echo "FAIL: job $id did not complete"
  exit 1
fi
cat "$log"
grep -q "^+ srun .*ddp_train" "$log" || { echo "FAIL: the job output shows no 'srun ... ddp_train' line"; exit 1; }
grep -q "2 ranks" "$log" || { echo "FAIL: the job output does not say 2 ranks"; exit 1; }
"$python" "$e2e/check_metrics.py" "$out/run" --epochs 3 --world-size 2

# One rank of 2 cores: srun must be given the job's --cpus-per-task.
task_probe "$out/hybrid" "$ddp_train"
id=$(submit -n 1 -c 2 --job-name=ddp_hybrid --output="$out/hybrid-%j.out" --export=ALL,DDP_TRAIN_BIN="$out/hybrid/ddp_train" \
     "$jobs/cpu.sbatch" "$e2e/tiny.nml" train.epochs=1 io.run_dir=$out/hybrid/run)
state=$(wait_final "$id" 120) || true
allowed=$(task_field "$out/hybrid" 0 Cpus_allowed_list)
threads=$(task_field "$out/hybrid" 0 OMP_NUM_THREADS)
echo "job $id (-n 1 -c 2): JobState=$state ExitCode=$(job_field "$id" ExitCode); task 0: Cpus_allowed_list=$allowed OMP_NUM_THREADS=$threads"
if [ "$state" != COMPLETED ] || [ -z "$allowed" ] || [ "$(cpu_count "$allowed")" != 2 ] || [ "$threads" != 2 ]; then
  show_job "$id" "$out/hybrid-$id.out"
  echo "FAIL: the task of sbatch -n 1 -c 2 should complete and may run on 2 cores with OMP_NUM_THREADS=2"
  exit 1
fi

# No input file: the template stops before srun, naming the problem.
id=$(submit -n 1 --job-name=ddp_noinput --output="$out/noinput-%j.out" "$jobs/cpu.sbatch")
state=$(wait_final "$id" 60) || true
log=$out/noinput-$id.out
echo "job $id without input file: JobState=$state ExitCode=$(job_field "$id" ExitCode)"
cat "$log" 2>/dev/null || true
if [ "$state" != FAILED ] || ! grep -q "error: no input file given" "$log"; then
  show_job "$id" "$log"
  echo "FAIL: the template without an input file should fail with 'error: no input file given'"
  exit 1
fi
echo PASS
