#!/usr/bin/env bash
# usage: memory_limit.sh CLUSTER_DIR JOBS_DIR DDP_TRAIN E2E_DIR PYTHON
#
# A preload under `sbatch --mem`, on the private Slurm started with --memory-cgroup
# (task/cgroup, ConstrainRAMSpace: the job's tasks in a memory cgroup of its limit).
# The data: 205 MiB (2 training shards of 12,800 x 2048 float32, 640 to validate).
#   1. sbatch -n 2 --mem=360M jobs/cpu.sbatch ... data.mode=preload: one copy per
#      node in shared memory fits; the job COMPLETES.
#   2. the same with data.preload_shared=F: a copy per rank (410 MiB) does not fit:
#      the job FAILS with exit 1 and one line naming the need, the room and the job's
#      cgroup limit (360.0 MiB), and Slurm saw no out-of-memory kill (no oom-kill
#      event in the job's output, JobState not OUT_OF_MEMORY).
# Runs in the test directory.
set -euo pipefail
cluster=$1 jobs=$2 ddp_train=$3 e2e=$4 python=$5
source "$(dirname "$0")/lib.sh"

out=$PWD/slurm_runs/memory
rm -rf "$out"
mkdir -p "$out/data"
"$python" - "$out/data" "$e2e" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from make_test_data import shard
rng = np.random.default_rng(11)
for name, n in (("train_000.h5", 12800), ("train_001.h5", 12800), ("val_000.h5", 640)):
    x = rng.standard_normal((n, 2048), dtype=np.float32)
    shard(os.path.join(sys.argv[1], name), x, x[:, :4].argmax(axis=1).astype(np.int64))
PY
cat >"$out/preload.nml" <<NML
&data
  train_files = '$out/data/train_*.h5'
  val_files = '$out/data/val_*.h5'
  mode = 'preload'
/
&model
  layers = 'linear(16)', 'relu', 'linear(4)'
/
&train
  epochs = 1, batch_size = 512, optimizer = 'sgd', lr = 0.05
/
&io
  checkpoint_every = 0
/
NML
export DDP_TRAIN_BIN=$ddp_train

# run NAME OVERRIDES...: one job of 2 tasks under --mem=360M; prints its JobState and ExitCode.
run() {
  local name=$1 id
  shift
  id=$(submit -n 2 --mem=360M --job-name="ddp_mem_$name" --output="$out/$name-%j.out" "$jobs/cpu.sbatch" \
       "$out/preload.nml" io.run_dir="$out/run_$name" "$@")
  echo "submitted job $id: sbatch -n 2 --mem=360M $jobs/cpu.sbatch $out/preload.nml io.run_dir=$out/run_$name $*" >&2
  local state
  state=$(wait_final "$id" 120) || true
  log=$(ls "$out/$name-$id.out")
  echo "--- job $id ($name): JobState=$state ExitCode=$(job_field "$id" ExitCode)" >&2
  grep -v '^  ' "$log" >&2 || true
  echo "$id $state $(job_field "$id" ExitCode)"
}

read -r id state code < <(run shared)
if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
  show_job "$id" "$out/shared-$id.out"
  echo "FAIL: one copy per node under --mem=360M did not complete"
  exit 1
fi
grep -q "preloaded, one copy per node in shared memory" "$out/shared-$id.out" ||
  { echo "FAIL: the data line does not say one copy per node"; exit 1; }
grep -q "^epoch 1/1 " "$out/shared-$id.out" || { echo "FAIL: no epoch line"; exit 1; }

read -r id state code < <(run per_rank data.preload_shared=F)
log=$out/per_rank-$id.out
if [ "$state" != FAILED ] || [ "$code" != 1:0 ]; then
  show_job "$id" "$log"
  echo "FAIL: a copy per rank under --mem=360M: JobState=$state ExitCode=$code, expected FAILED 1:0"
  exit 1
fi
if grep -qi "oom" "$log"; then
  echo "FAIL: Slurm reports an out-of-memory kill:"
  grep -i oom "$log"
  exit 1
fi
lines=$(grep -c "^error: " "$log" || true)
want="^error: data.mode = 'preload': the data need [0-9.]+ MiB on node [^ ]+ \\(a copy on each of its 2 rank\\(s\\)\\) and [0-9.]+ MiB is free under the memory limit of cgroup /[^ ]*job_$id[^ ]* \\(memory.limit_in_bytes 360.0 MiB\\)"
if [ "$lines" != 1 ] || ! grep -qE "$want" "$log"; then
  echo "FAIL: expected one line naming the job's cgroup limit of 360.0 MiB; $lines error line(s)"
  exit 1
fi
echo PASS
