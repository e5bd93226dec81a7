#!/usr/bin/env bash
# usage: readme_job.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# The job script of README.md's "On a cluster", taken from the README (JOBS_DIR/..)
# as it stands, on the private Slurm: `sbatch -n 2` (for its --ntasks=64) in a
# directory holding its fashion_mlp.nml (here the tiny input), ddp_train on PATH and no
# module: its `module load ddp_train` fails, and the script goes on.
#  1. the run ends: the job is COMPLETED with ExitCode 0:0, the script's status being
#     ddp_train's 0, and metrics.jsonl holds the 3 epochs of its train.epochs=3;
#  2. the same paced (1 s a step), sent SIGUSR1 once it trains: ddp_train checkpoints
#     and exits 75, and the script requeues the job (Restarts=1, PENDING).
# Runs in the test directory, which holds e2e_data/ (fixture e2e_data).
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

out=$PWD/slurm_runs/readme
rm -rf "$out"
mkdir -p "$out/bin"
readme=$jobs/../README.md
awk '/^## On a cluster/ { on = 1 } on && /^```sh$/ { block = 1; next } block && /^```$/ { exit } block' \
  "$readme" >"$out/job.sh"
echo "--- the job script of $readme (## On a cluster):"
cat "$out/job.sh"
if [ "$(head -n 1 "$out/job.sh")" != "#!/bin/bash" ] || ! grep -q "^srun ddp_train fashion_mlp.nml " "$out/job.sh"; then
  echo "FAIL: README.md's \"On a cluster\" holds no job script starting '#!/bin/bash' that runs 'srun ddp_train fashion_mlp.nml'"
  exit 1
fi
# ddp_train on PATH, and MODULEPATH an empty directory: no ddp_train module is found
# wherever one is installed.
ln -s "$ddp_train" "$out/bin/ddp_train"
mkdir -p "$out/no_modules"
export PATH=$out/bin:$PATH MODULEPATH=$out/no_modules
unset DDP_TRAIN_BIN

# submit_in NAME SBATCH_OPTIONS...: the README's script in $out/NAME, with the tiny
# input as its fashion_mlp.nml; prints the job id.
submit_in() {
  local name=$1
  shift
  mkdir -p "$out/$name"
  sed "s|'e2e_data/|'$PWD/e2e_data/|" "$e2e/tiny.nml" >"$out/$name/fashion_mlp.nml"
  submit -n 2 --job-name="ddp_readme_$name" --chdir="$out/$name" --output="$out/$name/job.out" "$@" "$out/job.sh"
}

# 1. To its end.
id=$(submit_in finished)
echo "job $id: sbatch -n 2 job.sh, in $out/finished"
wait_completed "$id" "$out/finished/job.out" 120
"$python" "$e2e/check_metrics.py" "$out/finished/runs/e2e_tiny" --epochs 3 --world-size 2

# 2. Stopped with SIGUSR1 during its 15 steps: exit 75 and the requeue.
id=$(submit_in stopped --export=ALL,DDP_TEST_STEP_DELAY_US=1000000)
log=$out/stopped/job.out
echo "job $id: DDP_TEST_STEP_DELAY_US=1000000 sbatch -n 2 job.sh, in $out/stopped"
wait_log "$id" "$log" "^epoch 1/" 60
echo "job $id trains: scancel --signal=USR1 $id"
stop_job "$id" "$log"
wait_requeued "$id" "$log" 60
grep -v "^epoch \|^  " "$log" || true
grep -q "^preempted: .*exit 75 for requeue" "$log" || { echo "FAIL: ddp_train did not stop with exit 75"; exit 1; }
scancel "$id"
echo PASS
