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
submitted=()

cleanup_jobs() {
  if [ ${#submitted[@]} -gt 0 ]; then scancel "${submitted[@]}" 2>/dev/null || true; fi
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
  submitted+=("$id")
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
