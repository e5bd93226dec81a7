# Helpers for the Slurm tests; sourced. Needs $cluster (the DIR of tools/slurm/start).
# Every wait is bounded; every job a test submits is cancelled when it exits.

if [ ! -f "$cluster/env" ] || [ ! -f "$cluster/pids" ]; then
  echo "no private Slurm running in $cluster (slurm_start skipped or failed): skipping"
  exit 77
fi
# shellcheck disable=SC1091
source "$cluster/env"  # SLURM_CONF: every client command talks to the private cluster
PATH=$PATH:/usr/sbin
# 2 ranks on a 2-core node next to slurmctld, slurmd and this script: Open MPI
# ranks that spin while waiting starve the rest for seconds. Waiting ranks yield.
export OMPI_MCA_mpi_yield_when_idle=1
# The ids of the jobs submitted, kept in a file: `id=$(submit ...)` runs submit in a
# subshell, whose variables the test never sees.
submitted=$(mktemp "${TMPDIR:-/tmp}/ddp_slurm_jobs.XXXXXX")

cleanup_jobs() {
  # shellcheck disable=SC2046
  if [ -s "$submitted" ]; then scancel $(cat "$submitted") 2>/dev/null || true; fi
  rm -f "$submitted"
}
trap cleanup_jobs EXIT

# job_field JOBID NAME: one field of `scontrol show job`, e.g. JobState, Restarts, ExitCode.
job_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# submit ARGS...: sbatch --parsable; prints the job id.
submit() {
  local id
  id=$(sbatch --parsable "$@") || { echo "FAIL: sbatch $*" >&2; exit 1; }
  id=${id%%;*}
  echo "$id" >>"$submitted"
  echo "$id"
}

# show_job JOBID [OUTPUT_FILE]: what to look at when a test fails.
show_job() {
  echo "--- scontrol show job $1"
  scontrol show job "$1" 2>&1 || true
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "--- $2 (last 40 lines)"
    tail -n 40 "$2"
  fi
  echo "--- slurmctld.log (last 15 lines)"
  tail -n 15 "$cluster/log/slurmctld.log" 2>/dev/null || true
  echo "--- slurmd.log (last 15 lines)"
  tail -n 15 "$cluster/log/slurmd.log" 2>/dev/null || true
}

# wait_final JOBID SECONDS: waits until the job has ended; prints its JobState.
wait_final() {
  local deadline=$((SECONDS + $2)) state=""
  while [ $SECONDS -lt $deadline ]; do
    state=$(job_field "$1" JobState)
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$state"
        return 0 ;;
    esac
    sleep 0.5
  done
  echo "STILL_${state:-UNKNOWN}_AFTER_${2}s"
  return 1
}

# stop_job JOBID LOG: scancel --signal=USR1, resent every 5 s (6 tries) until the job
# shows it got the signal (its 'preempted: ' line in LOG, or it left RUNNING):
# slurmctld, starved by the 2 ranks on 2 cores, can drop the request ("slurm_msg_sendto:
# Unexpected missing socket error") while scancel still exits 0.
stop_job() {
  local attempt state
  for attempt in 1 2 3 4 5 6; do
    scancel --signal=USR1 "$1" || echo "scancel attempt $attempt exited $?"
    for _ in $(seq 50); do
      if grep -q "^preempted: " "$2" 2>/dev/null; then return 0; fi
      # An empty state is scontrol failing to reach slurmctld (the moments it drops
      # connections, when scancel may fail too), not the job leaving RUNNING.
      state=$(job_field "$1" JobState)
      if [ -n "$state" ] && [ "$state" != RUNNING ]; then return 0; fi
      sleep 0.1
    done
    echo "job $1 shows no sign of SIGUSR1 after 5 s (attempt $attempt): sending it again"
  done
}

# task_probe DIR DDP_TRAIN: writes DIR/ddp_train, a stand-in that records in each task
# what Slurm gave it into DIR/task<SLURM_PROCID>, then execs DDP_TRAIN with its
# arguments. Cpus_allowed_list is the kernel's, of the very process that becomes
# ddp_train (/proc/$$ before exec); the others are the task's environment.
task_probe() {
  mkdir -p "$1"
  cat >"$1/ddp_train" <<PROBE
#!/bin/sh
{
  echo "SLURM_LOCALID=\$SLURM_LOCALID"
  echo "CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES-unset}"
  echo "OMP_NUM_THREADS=\${OMP_NUM_THREADS-unset}"
  sed -n 's/^Cpus_allowed_list:[[:space:]]*/Cpus_allowed_list=/p' /proc/\$\$/status
} >$(printf %q "$1")/task\$SLURM_PROCID
exec $(printf %q "$2") "\$@"
PROBE
  chmod +x "$1/ddp_train"
}

# task_field DIR TASK NAME: one line of what task_probe recorded for task TASK.
task_field() {
  sed -n "s/^$3=//p" "$1/task$2" 2>/dev/null
}

# cpu_count LIST: how many CPUs a Cpus_allowed_list such as 0-1,4 names.
cpu_count() {
  local n=0 part parts
  IFS=, read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi
  done
  echo "$n"
}

# wait_completed JOBID LOG SECONDS: waits for the job's end and shows it (state, exit
# code, LOG less its progress lines); fails the test unless COMPLETED with ExitCode 0:0.
wait_completed() {
  local state code
  state=$(wait_final "$1" "$3") || true
  code=$(job_field "$1" ExitCode)
  echo "job $1: JobState=$state ExitCode=$code"
  grep -v "^epoch \|^  " "$2" || true
  if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
    show_job "$1" "$2"
    echo "FAIL: job $1 should end COMPLETED with ExitCode 0:0"
    exit 1
  fi
}

# wait_log JOBID LOG PATTERN SECONDS: waits until a line of LOG matches PATTERN (grep),
# the job still queued or running; fails the test when it is not there in time.
wait_log() {
  local deadline=$((SECONDS + $4))
  until grep -q "$3" "$2" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ] || [ -z "$(squeue -h -j "$1" 2>/dev/null)" ]; then
      show_job "$1" "$2"
      echo "FAIL: job $1 printed no line /$3/ in time"
      exit 1
    fi
    sleep 0.2
  done
}

# wait_requeued JOBID LOG SECONDS: waits until the job is pending again after a requeue
# (Restarts 1 or more); fails the test when it ends instead, or is not requeued in time.
wait_requeued() {
  local deadline=$((SECONDS + $3)) state restarts
  while :; do
    state=$(job_field "$1" JobState)
    restarts=$(job_field "$1" Restarts)
    if [ "${restarts:-0}" -ge 1 ] && [ "$state" = PENDING ]; then break; fi
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) ;;
      *) if [ $SECONDS -lt $deadline ]; then sleep 0.2; continue; fi ;;
    esac
    show_job "$1" "$2"
    echo "FAIL: job $1 should have been requeued (JobState=$state Restarts=${restarts:-0})"
    exit 1
  done
  echo "job $1 requeued: JobState=$state Restarts=$restarts Reason=$(job_field "$1" Reason)"
}
