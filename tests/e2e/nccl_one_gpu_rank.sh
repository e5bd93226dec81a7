#!/usr/bin/env bash
# usage: nccl_one_gpu_rank.sh NCCL_ONE_GPU
#
# tools/nccl_one_gpu takes each rank's NCCL host from the launcher that started it:
# Open MPI's OMPI_COMM_WORLD_RANK, PMIx's PMIX_RANK, MPICH's PMI_RANK, and only then
# Slurm's SLURM_PROCID, which a launcher run inside an allocation inherits (every rank
# SLURM_PROCID=0: all of them one host to NCCL, which ddp_train's 'nccl' refuses).
# Without any, one line and exit 2. Each case runs it with only that environment.
set -u
launcher=$1
failures=0
case_() { # WANT VAR=VALUE ...
  local want=$1 got
  shift
  got=$(env -i PATH=/usr/bin:/bin "$@" "$launcher" sh -c 'echo "$NCCL_HOSTID $NCCL_IB_DISABLE $NCCL_SOCKET_IFNAME $NCCL_NET"' 2>&1)
  if [[ $got != "$want 1 lo Socket" ]]; then
    echo "FAILED: $* gave '$got', expected '$want 1 lo Socket'"
    failures=$((failures + 1))
  else
    echo "ok: $* -> $want"
  fi
}
case_ host2 OMPI_COMM_WORLD_RANK=2 PMIX_RANK=2 SLURM_PROCID=0
case_ host3 PMIX_RANK=3 SLURM_PROCID=0
case_ host1 PMI_RANK=1 SLURM_PROCID=0 # MPICH's mpiexec inside an allocation
case_ host5 SLURM_PROCID=5            # srun
out=$(env -i PATH=/usr/bin:/bin "$launcher" true 2>&1)
rc=$?
if [[ $rc != 2 || $(printf '%s\n' "$out" | wc -l) != 1 || $out != "nccl_one_gpu: no rank in the environment"* ]]; then
  echo "FAILED: without a rank: exit $rc, '$out' (expected exit 2 and one line)"
  failures=$((failures + 1))
else
  echo "ok: without a rank -> exit 2: $out"
fi
((failures == 0))
