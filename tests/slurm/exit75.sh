#!/usr/bin/env bash
# usage: exit75.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# Exit 75 from every task under srun when one is slow to exit. `sbatch -n 2
# jobs/cpu.sbatch` of a long tiny run, with srun --kill-on-bad-exit (through
# SLURM_KILL_BAD_EXIT=1, as a site's KillOnBadExit=1 would): srun ends the step at
# task 0's exit 75, SIGTERM to the other tasks and SIGKILL KillWait later. Task 1
# sleeps KillWait + 5 s after MPI_Finalize (DDP_TEST_EXIT_DELAY_MS). Each task runs
# under tests/checkpoint/rank_status.py, which records its exit status. Stopped with
# scancel --signal=USR1 once it trains: every task must exit 75 (with the SIGTERM
# swallowed task 1 was killed and the job's exit code was 137, which requeue.sbatch
# does not requeue), the job ExitCode 75:0, and the stop's checkpoint must load:
# `ddp_train --check` would resume from it.
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

out=slurm_runs/exit75
rm -rf "$out"
mkdir -p "$out/status"
status=$(cd "$out/status" && pwd)
kill_wait=$(scontrol show config | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
echo "KillWait = ${kill_wait:?} s: task 1 sleeps $((kill_wait + 5)) s after MPI_Finalize"
# cpu.sbatch runs `srun $DDP_TRAIN_BIN "$@"`: this wrapper, whose arguments are ddp_train's.
wrapper=$PWD/$out/ddp_train_status
printf '#!/bin/sh\nexec %q %q %q %q "$@"\n' "$python" "$(cd "$(dirname "$0")/../checkpoint" && pwd)/rank_status.py" \
  "$status" "$ddp_train" >"$wrapper"
chmod +x "$wrapper"
run=$out/run
export DDP_TRAIN_BIN=$wrapper SLURM_KILL_BAD_EXIT=1 DDP_TEST_EXIT_DELAY_MS=$(((kill_wait + 5) * 1000))@rank1
id=$(submit -n 2 --job-name=ddp_exit75 --output="$out/job-%j.out" "$jobs/cpu.sbatch" "$e2e/tiny.nml" \
     train.epochs=100000 train.log_every=0 io.checkpoint_every=0 io.run_dir=$run)
log=$out/job-$id.out
echo "job $id: SLURM_KILL_BAD_EXIT=1 DDP_TEST_EXIT_DELAY_MS=$DDP_TEST_EXIT_DELAY_MS cpu.sbatch $e2e/tiny.nml ... io.run_dir=$run"
wait_log "$id" "$log" "^epoch 3/" 90
echo "job $id trains: scancel --signal=USR1 $id"
stop_job "$id" "$log"
state=$(wait_final "$id" $((kill_wait + 60))) || true
code=$(job_field "$id" ExitCode)
echo "job $id: JobState=$state ExitCode=$code"
grep -v "^epoch \|^  " "$log" || true
for r in 0 1; do
  for _ in $(seq 50); do [ -f "$status/rank$r" ] && break; sleep 0.1; done
  echo "task $r: exit status $(cat "$status/rank$r" 2>/dev/null || echo "not recorded (killed with its recorder)")"
done
if [ "$(cat "$status/rank0" 2>/dev/null)" != 75 ] || [ "$(cat "$status/rank1" 2>/dev/null)" != 75 ] || [ "$code" != 75:0 ]; then
  show_job "$id" "$log"
  echo "FAIL: every task should exit 75 and the job with ExitCode 75:0, the slow one too"
  exit 1
fi
ckpt=$run/checkpoints/$(cat "$run/checkpoints/latest")
env -u DDP_TEST_EXIT_DELAY_MS "$ddp_train" --check "$e2e/tiny.nml" train.epochs=100000 io.checkpoint_every=0 io.run_dir=$run | tee "$out/check.out"
grep -q "^checkpoint: would resume from $ckpt " "$out/check.out" ||
  { echo "FAIL: ddp_train --check does not resume from the stop's checkpoint $ckpt"; exit 1; }
echo PASS
