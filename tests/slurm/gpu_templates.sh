#!/usr/bin/env bash
# usage: gpu_templates.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# The GPU templates on the private Slurm started with --gpus=4: a node of 2 CPUs and
# 4 stand-in GPUs (a gres as a GPU node declares it). They run the CPU build of
# ddp_train behind tests/slurm/lib.sh's task_probe, which records in each task what
# Slurm gave it. The templates' GPU binding (--gpus-per-node=4) is theirs; the tests
# set only tasks and CPUs for the 2-CPU node.
#  1. gpu_node.sbatch, 2 tasks of 1 CPU: each task's CUDA_VISIBLE_DEVICES is 0,1,2,3
#     (all the node's GPUs, each rank to take its own by node-local rank: 0 and 1), each
#     may run on 1 core, not the other's; the job COMPLETED, ExitCode 0:0.
#  2. gpu_node.sbatch, 1 task of 2 CPUs, without DDP_TRAIN_BIN and ddp_train on PATH:
#     `module load ddp_train` fails here and the job goes on; the task may run on both
#     cores (srun is given --cpus-per-task) with OMP_NUM_THREADS=2; COMPLETED, 0:0.
#  3. multi_node.sbatch on one node (-N 1), 2 tasks of 1 CPU: as 1.
#  4. requeue.sbatch with gpu_node's resources, sent SIGUSR1 once it trains: ddp_train
#     checkpoints and exits 75, the job requeues itself (Restarts=1, PENDING).
# Runs in the test directory, which holds e2e_data/ (fixture e2e_data).
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

gres=$(scontrol show node -o | tr ' ' '\n' | sed -n 's/^Gres=//p')
[ "$gres" = gpu:4 ] || { echo "FAIL: the cluster of $cluster has Gres=$gres, not gpu:4 (tools/slurm/start --gpus=4)"; exit 1; }
out=$PWD/slurm_runs/gpu_templates
rm -rf "$out"
mkdir -p "$out"
unset DDP_TRAIN_BIN

# run NAME EPOCHS SBATCH_OPTIONS... -- TEMPLATE: submits TEMPLATE on the tiny input
# (run directory $out/NAME/run); the probe for its tasks is $out/NAME/ddp_train.
# Prints the job id.
run() {
  local name=$1 epochs=$2 opts=()
  shift 2
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  task_probe "$out/$name" "$ddp_train"
  submit --job-name="ddp_$name" --output="$out/$name.out" "${opts[@]}" "$jobs/$2" "$e2e/tiny.nml" \
    train.epochs="$epochs" io.run_dir="$out/$name/run"
}

# tasks_saw NAME TASKS CPUS: every task recorded all 4 GPUs, its node-local rank, CPUS
# cores it may run on (none of them another task's when CPUS is 1), OMP_NUM_THREADS=CPUS.
tasks_saw() {
  local name=$1 tasks=$2 cpus=$3 t devices lrank allowed threads seen=" "
  for ((t = 0; t < tasks; t++)); do
    devices=$(task_field "$out/$name" "$t" CUDA_VISIBLE_DEVICES)
    lrank=$(task_field "$out/$name" "$t" SLURM_LOCALID)
    allowed=$(task_field "$out/$name" "$t" Cpus_allowed_list)
    threads=$(task_field "$out/$name" "$t" OMP_NUM_THREADS)
    echo "$name task $t: SLURM_LOCALID=$lrank CUDA_VISIBLE_DEVICES=$devices Cpus_allowed_list=$allowed OMP_NUM_THREADS=$threads"
    if [ "$devices" != 0,1,2,3 ] || [ "$lrank" != "$t" ] || [ -z "$allowed" ] ||
       [ "$(cpu_count "$allowed")" != "$cpus" ] || [ "$threads" != "$cpus" ] || [[ $seen == *" $allowed "* ]]; then
      echo "FAIL: $name task $t should see CUDA_VISIBLE_DEVICES=0,1,2,3 as node-local rank $t," \
           "may run on $cpus core(s) of its own and have OMP_NUM_THREADS=$cpus"
      exit 1
    fi
    seen+="$allowed "
  done
  [ ! -e "$out/$name/task$tasks" ] || { echo "FAIL: $name ran more than $tasks task(s)"; exit 1; }
}

# 1. gpu_node.sbatch, 2 ranks of 1 core.
id=$(run gpu_node 2 --export=ALL,DDP_TRAIN_BIN="$out/gpu_node/ddp_train" --ntasks-per-node=2 --cpus-per-task=1 \
     -- gpu_node.sbatch)
echo "job $id (gpu_node): sbatch --ntasks-per-node=2 --cpus-per-task=1 gpu_node.sbatch tiny.nml train.epochs=2"
wait_completed "$id" "$out/gpu_node.out" 120
if grep -q "module load" "$out/gpu_node.out"; then
  echo "FAIL: with DDP_TRAIN_BIN set the template should load no module"
  exit 1
fi
tasks_saw gpu_node 2 1
"$python" "$e2e/check_metrics.py" "$out/gpu_node/run" --epochs 2 --world-size 2

# 2. gpu_node.sbatch, 1 rank of 2 cores, ddp_train from PATH (the probe, named so).
# MODULEPATH names an empty directory: no ddp_train module is found wherever one is installed.
mkdir -p "$out/no_modules"
id=$(run gpu_node_path 1 --export="ALL,PATH=$out/gpu_node_path:$PATH,MODULEPATH=$out/no_modules" \
     --ntasks-per-node=1 --cpus-per-task=2 -- gpu_node.sbatch)
echo "job $id (gpu_node_path): PATH=$out/gpu_node_path:... sbatch --ntasks-per-node=1 --cpus-per-task=2 gpu_node.sbatch tiny.nml"
wait_completed "$id" "$out/gpu_node_path.out" 120
grep -q "^warning: 'module load ddp_train' failed; looking for ddp_train on PATH$" "$out/gpu_node_path.out" ||
  { echo "FAIL: the job output does not say that 'module load ddp_train' failed"; exit 1; }
grep -q "^+ srun .* $out/gpu_node_path/ddp_train " "$out/gpu_node_path.out" ||
  { echo "FAIL: the job did not run the ddp_train on PATH"; exit 1; }
tasks_saw gpu_node_path 1 2

# 3. multi_node.sbatch on this one node.
id=$(run multi_node 2 --export=ALL,DDP_TRAIN_BIN="$out/multi_node/ddp_train" -N 1 --ntasks-per-node=2 --cpus-per-task=1 \
     -- multi_node.sbatch)
echo "job $id (multi_node): sbatch -N 1 --ntasks-per-node=2 --cpus-per-task=1 multi_node.sbatch tiny.nml train.epochs=2"
wait_completed "$id" "$out/multi_node.out" 120
tasks_saw multi_node 2 1
"$python" "$e2e/check_metrics.py" "$out/multi_node/run" --epochs 2 --world-size 2

# 4. requeue.sbatch with the GPUs as gpu_node.sbatch binds them, stopped once it trains
#    (0.1 s a step, so it is still training when the signal comes).
id=$(run requeue 100000 --export=ALL,DDP_TRAIN_BIN="$out/requeue/ddp_train",DDP_TEST_STEP_DELAY_US=100000 \
     -N 1 --ntasks-per-node=2 --gpus-per-node=4 --cpus-per-task=1 -- requeue.sbatch)
log=$out/requeue.out
echo "job $id (requeue): sbatch -N 1 --ntasks-per-node=2 --gpus-per-node=4 --cpus-per-task=1 requeue.sbatch tiny.nml"
wait_log "$id" "$log" "^epoch 3/" 60
echo "job $id trains: scancel --signal=USR1 $id"
stop_job "$id" "$log"
wait_requeued "$id" "$log" 60
grep -v "^epoch \|^  " "$log" || true
grep -q "stopped with a checkpoint (exit 75); requeueing" "$log" ||
  { echo "FAIL: the job output does not show ddp_train's exit 75 and the requeue"; exit 1; }
tasks_saw requeue 2 1
scancel "$id"
echo PASS
