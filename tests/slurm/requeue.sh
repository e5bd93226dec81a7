#!/usr/bin/env bash
# usage: requeue.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# Preemption and requeue on the private Slurm, against ddp_train's checkpoint
# contract: on SIGUSR1 (or SIGTERM) it writes a checkpoint into
# <run_dir>/checkpoints/ at the next step boundary and every rank exits 75; a
# new start in the same run_dir (default &io resume = 'auto') continues from it.
#  1. reference: `sbatch -n 2 jobs/cpu.sbatch` of a long tiny run, uninterrupted;
#  2. the same run from jobs/requeue.sbatch, sent `scancel --signal=USR1` once it
#     has trained some epochs: it must checkpoint, exit 75, requeue itself
#     (Restarts=1), resume (its second start does not begin at epoch 1), end
#     COMPLETED, and its final record must equal the reference's exactly.
# Slurm holds a requeued job ~2 minutes (BeginTime); the test releases it after 3 s.
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

# Tiny epochs take 1.3 ms (AMX Xeon) to 5 ms (2-core AVX2 EPYC; batch 2,
# streamed): unpaced, the whole run can be over in 11 s, and a Slurm command that
# waits out slurmctld's message timeout (10 s; it drops connections while 2 ranks
# hold both cores) once left this script reading the finished run. So the
# requeueable job is paced (DDP_TEST_STEP_DELAY_US: every rank sleeps before each
# step; the numbers are unchanged): 1500 epochs of 20 steps take at least 30 s
# wherever it runs, with the ranks off the cores most of that time. The signal
# goes once 100 epochs are done. The reference runs unpaced. (3000 epochs at 500 us
# took 57 s of CPU on a 2-core EPYC, half of it the reference's.)
epochs=${DDP_REQUEUE_EPOCHS:-1500}
step_delay_us=${DDP_REQUEUE_STEP_DELAY_US:-1000}
signal_after=${DDP_REQUEUE_SIGNAL_AFTER:-100}  # epochs trained before the signal
out=slurm_runs/requeue
rm -rf "$out"
mkdir -p "$out"
export DDP_TRAIN_BIN=$ddp_train
# Periodic checkpoints only every 1000 epochs: the resume at epoch ~100-300 can
# only come from the checkpoint written on SIGUSR1.
# Streaming reads (prefetch thread): the sampler position is part of what resumes.
args=("$e2e/tiny.nml" train.epochs=$epochs train.batch_size=2 train.lr=0.02 data.mode=stream
      train.log_every=100000 io.checkpoint_every=1000)

records() { [ -f "$1/metrics.jsonl" ] && wc -l <"$1/metrics.jsonl" || echo 0; }

# 1. The uninterrupted reference.
ref=$(submit -n 2 --job-name=ddp_ref --output="$out/ref-%j.out" "$jobs/cpu.sbatch" "${args[@]}" io.run_dir=$out/ref)
echo "reference job $ref: cpu.sbatch ${args[*]} io.run_dir=$out/ref"
state=$(wait_final "$ref" 300) || true
echo "reference job $ref: JobState=$state ExitCode=$(job_field "$ref" ExitCode)"
if [ "$state" != COMPLETED ]; then
  show_job "$ref" "$out/ref-$ref.out"
  echo "FAIL: the reference job did not complete"
  exit 1
fi
tail -n 2 "$out/ref-$ref.out"

# 2. The same run as a requeueable job, signalled once it is training.
run=$out/run
id=$(submit -n 2 --job-name=ddp_requeue --export=ALL,DDP_TEST_STEP_DELAY_US=$step_delay_us --output="$out/requeue-%j.out" "$jobs/requeue.sbatch" "${args[@]}" io.run_dir=$run)
log=$out/requeue-$id.out
echo "requeue job $id: DDP_TEST_STEP_DELAY_US=$step_delay_us requeue.sbatch ${args[*]} io.run_dir=$run"
deadline=$((SECONDS + 90))
polls=0
while [ "$(records "$run")" -lt "$signal_after" ]; do
  polls=$((polls + 1))
  if [ $SECONDS -ge $deadline ] || { [ $((polls % 20)) = 0 ] && [ -z "$(squeue -h -j "$id" 2>/dev/null)" ]; }; then
    show_job "$id" "$log"
    echo "FAIL: job $id did not reach $signal_after epochs of training in time"
    exit 1
  fi
  sleep 0.1
done
at_signal=$(records "$run")
echo "job $id has trained $at_signal epochs: scancel --signal=USR1 $id"
stop_job "$id" "$log"  # resent while slurmctld drops it

# It must stop with a checkpoint and requeue itself: Restarts=1, pending again.
deadline=$((SECONDS + 90))
while :; do
  state=$(job_field "$id" JobState)
  restarts=$(job_field "$id" Restarts)
  if [ "${restarts:-0}" -ge 1 ] && [ "$state" = PENDING ]; then break; fi
  case $state in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)
      show_job "$id" "$log"
      echo "FAIL: after SIGUSR1 job $id ended $state with Restarts=${restarts:-0} instead of requeueing:" \
           "ddp_train must checkpoint and exit 75 on SIGUSR1 (the checkpoint contract)"
      exit 1 ;;
  esac
  if [ $SECONDS -ge $deadline ]; then
    show_job "$id" "$log"
    echo "FAIL: job $id not requeued 90 s after SIGUSR1 (JobState=$state Restarts=${restarts:-0})"
    exit 1
  fi
  sleep 0.2
done
echo "job $id requeued (Restarts=$restarts, Reason=$(job_field "$id" Reason)); checkpoints:"
ls -l "$run/checkpoints/" || { show_job "$id" "$log"; echo "FAIL: no $run/checkpoints/ after SIGUSR1"; exit 1; }
[ -n "$(ls -A "$run/checkpoints/")" ] || { echo "FAIL: $run/checkpoints/ is empty after SIGUSR1"; exit 1; }
at_requeue=$(records "$run")
# Skip Slurm's requeue hold, but not within the second of the requeue: a start
# then is refused ("Job credential revoked") and the job ends FAILED.
sleep 3
scontrol update JobId="$id" StartTime=now

state=$(wait_final "$id" 300) || true
echo "job $id: JobState=$state ExitCode=$(job_field "$id" ExitCode) Restarts=$(job_field "$id" Restarts)"
if [ "$state" != COMPLETED ] || [ "$(job_field "$id" ExitCode)" != 0:0 ] || [ "$(job_field "$id" Restarts)" != 1 ]; then
  show_job "$id" "$log"
  echo "FAIL: job $id should end COMPLETED, exit code 0:0, after exactly one restart"
  exit 1
fi
grep -v "^epoch \|^  \|^step " "$log" || true
"$python" "$(dirname "$0")/check_requeue.py" "$out/ref" "$run" "$log" "$epochs" "$at_signal" "$at_requeue"
