#!/usr/bin/env bash
# usage: install_load_run.sh BUILD_DIR VERSION MPIEXEC PYTHON [lmod]
#
# Installs the build into a temporary prefix, loads it as an environment module
# in a fresh bash, checks that `module help` names the manual and that `man ddp_train`
# renders the installed man page (the system's pages still found), and from a
# directory outside the source tree runs `ddp_train --version`, `--help`, `--keys`,
# a 2-rank training run on data made by the installed tool, with the installed
# input file, and the installed plot_metrics on it.
# The module system: Environment Modules (Lmod when it is the only one), or with
# `lmod` Lmod alone, from its own init script (Debian's lmod, or the copy that
# tools/install_deps --test unpacks into /opt/lmod). Exit 77 (skipped) without it.
set -euo pipefail
build=$(cd "$1" && pwd)
version=$2
mpiexec=$3
python=$4
system=${5:-any}

lmod_inits=(/usr/share/lmod/lmod/init/bash /opt/lmod/usr/share/lmod/lmod/init/bash)
if [ "$system" = lmod ]; then
  inits=("${lmod_inits[@]}")
else
  inits=(/usr/share/modules/init/bash "${MODULESHOME:-/nonexistent}/init/bash" "${lmod_inits[@]}")
fi
init=""
for f in "${inits[@]}"; do
  if [ -f "$f" ]; then init=$f; break; fi
done
if [ -z "$init" ]; then
  echo "no module system among ${inits[*]} (tools/install_deps --test installs both): skipping"
  exit 77
fi

tmp=$(mktemp -d /tmp/ddp_module_test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
modulefile=$prefix/share/modulefiles/ddp_train/$version
for f in bin/ddp_train bin/prepare_fashion_mnist bin/make_regression_data bin/plot_metrics bin/merge_traces bin/scaling_model bin/torch_to_h5 bin/h5_to_torch \
         bin/llmc_to_h5 bin/text_to_tokens bin/make_markov_tokens bin/token_shards.py \
         share/ddp_train/inputs/regression.nml share/ddp_train/jobs/cpu.sbatch \
         share/ddp_train/jobs/requeue.sbatch share/modulefiles/ddp_train/$version \
         share/man/man1/ddp_train.1 share/doc/ddp_train/README.md share/doc/ddp_train/docs/index.md \
         share/doc/ddp_train/docs/input.md; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
echo "== $modulefile"
cat "$modulefile"

mkdir -p "$tmp/work"
# A login-like shell: nothing of this build on PATH, only what the module sets.
env -i HOME="$tmp" PATH=/usr/local/bin:/usr/bin:/bin TERM=dumb \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    INIT="$init" SYSTEM="$system" PREFIX="$prefix" WORK="$tmp/work" VERSION="$version" MPIEXEC="$mpiexec" PYTHON="$python" \
    bash --noprofile --norc -euo pipefail -c '
fail() { echo "FAIL: $*"; exit 1; }
# Here-strings, not `... | grep -q`: under pipefail grep leaving early fails the pipeline.
shows() { grep -qF "$1" <<<"$(tr -s " \n" " " <out.txt)"; }  # Lmod wraps long lines
source "$INIT"
echo "== $INIT: $(module --version 2>&1 | grep -m1 .)"
# Lmod, and not an Environment Modules function that came along some other way.
if [ "$SYSTEM" = lmod ]; then
  grep -q "Modules based on Lua" <<<"$(module --version 2>&1)" || fail "module is not Lmod after sourcing $INIT"
fi
module use "$PREFIX/share/modulefiles"
# Both systems list names in avail, and show the whatis line in whatis and keyword
# searches (Lmod also in spider, as the Description).
echo "== module avail / whatis / keyword"
module avail ddp_train 2>&1 | tee out.txt
shows "ddp_train/$VERSION" || fail "module avail does not list ddp_train/$VERSION"
whatis="ddp_train $VERSION: data-parallel neural-network trainer"
module whatis ddp_train 2>&1 | tee out.txt
shows "$whatis" || fail "module whatis does not show \"$whatis\""
module keyword neural-network 2>&1 | tee out.txt
shows "$whatis" || fail "module keyword neural-network does not find ddp_train"
if [ "$SYSTEM" = lmod ]; then
  module spider "ddp_train/$VERSION" 2>&1 | tee out.txt
  shows "Description: $whatis" ||
    fail "module spider ddp_train/$VERSION shows no Description with \"$whatis\""
fi
# module help names the manual, installed where it says.
echo "== module help ddp_train"
module help ddp_train 2>&1 | tee out.txt
manual="$PREFIX/share/doc/ddp_train/docs/index.md"
shows "$manual" || fail "module help ddp_train does not name the manual $manual"
shows "man ddp_train" || fail "module help ddp_train does not mention man ddp_train"
[ -f "$manual" ] || fail "the manual $manual is not installed"
rm out.txt
module load ddp_train
echo "== man ddp_train (MANPATH=$MANPATH)"
MANPAGER=cat MANWIDTH=80 man ddp_train >man.txt 2>&1 || { cat man.txt; fail "man ddp_train failed"; }
head -n 25 man.txt
grep -q "^SYNOPSIS" man.txt || fail "man ddp_train: no SYNOPSIS"
grep -q "^INPUT KEYS" man.txt || fail "man ddp_train: no INPUT KEYS"
grep -q "^ *train\.lr" man.txt || fail "man ddp_train: no train.lr"
rm man.txt
# The module puts its pages before the system'"'"'s, not in their place.
if [ -e /usr/share/man/man1/ls.1.gz ]; then
  man -w ls >/dev/null 2>&1 || fail "after module load, man finds no system page (MANPATH=$MANPATH)"
fi
[ "$(command -v ddp_train)" = "$PREFIX/bin/ddp_train" ] || fail "ddp_train on PATH is $(command -v ddp_train)"
[ "$DDP_TRAIN_ROOT" = "$PREFIX" ] || fail "DDP_TRAIN_ROOT=$DDP_TRAIN_ROOT"
[ -f "$DDP_TRAIN_INPUTS/regression.nml" ] || fail "DDP_TRAIN_INPUTS=$DDP_TRAIN_INPUTS"
[ -x "$DDP_TRAIN_JOBS/requeue.sbatch" ] || fail "DDP_TRAIN_JOBS=$DDP_TRAIN_JOBS"
[ -n "$DDP_TRAIN_MPI" ] && [ -n "$DDP_TRAIN_HDF5" ] || fail "DDP_TRAIN_MPI/HDF5 not set"
echo "DDP_TRAIN_MPI=$DDP_TRAIN_MPI DDP_TRAIN_HDF5=$DDP_TRAIN_HDF5"

cd "$WORK"
echo "== ddp_train --version (in $PWD)"
ddp_train --version | tee version.txt
grep -q "^ddp_train $VERSION" version.txt || fail "--version: no \"ddp_train $VERSION\" line"
grep -q "HDF5" version.txt || fail "--version: no HDF5"
ddp_train --help >help.txt
head -n 1 help.txt | grep -q "^usage: ddp_train" || fail "--help: the first line is not ddp_train'"'"'s usage"
ddp_train --keys >keys.txt
grep -q "^train\.lr " keys.txt || fail "--keys: no train.lr"

echo "== make_regression_data data/regression"
make_regression_data data/regression
cp "$DDP_TRAIN_INPUTS/regression.nml" .
echo "== $MPIEXEC -n 2 ddp_train --trace regression.nml train.epochs=3 io.run_dir=runs/module io.trace_steps=1,2"
timeout 120 "$MPIEXEC" -n 2 --oversubscribe ddp_train --trace regression.nml train.epochs=3 io.run_dir=runs/module \
  train.log_every=1000 io.trace_steps=1,2 | tail -n 3
"$PYTHON" - <<PY
import json, math, sys
records = [json.loads(l) for l in open("runs/module/metrics.jsonl")]
last = records[-1]
print(last)
ok = (len(records) == 3 and last["epoch"] == 3 and last["world_size"] == 2
      and math.isfinite(last["val_loss"]) and last["val_loss"] < records[0]["val_loss"])
sys.exit(0 if ok else "FAIL: metrics " + repr(records))
PY
echo "== plot_metrics runs/module"
plot_metrics runs/module -o module.png
[ "$(stat -c %s module.png)" -gt 20000 ] || fail "plot_metrics wrote no plot"
echo "== merge_traces runs/module/trace"
merge_traces runs/module/trace || fail "merge_traces failed"
"$PYTHON" - <<PY
import json, sys
events = json.load(open("runs/module/trace/merged.json"))["traceEvents"]
procs = sorted(e["pid"] for e in events if e["name"] == "process_name")
steps = sorted({e["name"] for e in events if e["name"] in ("step 1", "step 2", "step 3")})
sys.exit(0 if procs == [0, 1] and steps == ["step 1", "step 2"] else f"FAIL: merged.json: {procs} {steps}")
PY
module unload ddp_train
[ -z "${DDP_TRAIN_ROOT:-}" ] || fail "module unload left DDP_TRAIN_ROOT"
! command -v ddp_train >/dev/null || fail "module unload left ddp_train on PATH"
echo PASS
'
