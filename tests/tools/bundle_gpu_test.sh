#!/usr/bin/env bash
# tools/bundle_gpu on this build, run where MPI and HDF5 are not: a private mount
# namespace hides every library the bundle packed (but those this script's own
# tools need), Open MPI's launcher, components, help files and configuration, and
# PMIx's. There the system's mpiexec and the build's own ddp_train must fail (what
# is hidden is hidden), and from the bundle, in a checkout that is not the source
# tree: mpiexec trains the tiny classification on 2 ranks to its validation
# accuracy and passes SIGUSR1 on to the ranks (a checkpoint, exit 75), and ctest
# runs an MPI test, two python fixtures (with the python3 first on PATH, as on a
# node), one of them Fashion-MNIST's from the packed shards, its IDX files hidden,
# and a training test, cmake hidden (a node need not have it), through the bundle's
# CTest files; with a library taken out of the bundle, env.sh names the program
# that needs it.
# usage: bundle_gpu_test.sh SOURCE_DIR BUILD_DIR   (run in the build tree's tests
# folder, after the e2e_data and fashion fixtures; needs root for the mount namespace)
set -euo pipefail
source_dir=$1 build=$2
if [[ $(id -u) != 0 ]] || ! command -v unshare >/dev/null || ! command -v patchelf >/dev/null; then
  echo "SKIPPED: needs root, unshare and patchelf"
  exit 77
fi
tmp=$(mktemp -d "$build/bundle_gpu_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
DATA="e2e_data/tiny data/fashion-mnist" BUILD_DIR=$build "$source_dir/tools/bundle_gpu" "$tmp/bundle.tar" ddp_train test_backend

checkout=$tmp/checkout
python=$(sed -n 's/^DDP_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")  # one with numpy and h5py
mkdir -p "$checkout"
for d in inputs tests tools; do ln -s "$source_dir/$d" "$checkout/$d"; done
tar -C "$checkout" -xf "$tmp/bundle.tar"

# What to hide: each packed library's system copy, but the libraries of the tools
# used below; Open MPI's and PMIx's folders and launchers.
keep=$({
  for t in bash ctest mount grep sed cat mkdir ln dirname find sort python3 readlink env; do
    ldd "$(command -v $t)" 2>/dev/null
  done
  # and those of the python fixture's numpy and h5py (libsz, libaec, libhdf5_serial)
  find $("$python" -c 'import os, h5py, numpy; print(*(os.path.dirname(m.__file__) for m in (h5py, numpy)))') \
       -name '*.so*' -exec ldd {} + 2>/dev/null
} | sed -n 's/^\s*\([^ ]*\) => .*/\1/p' | sort -u)
hidden_libs=()
while IFS=$'\t' read -r packed origin; do
  grep -qxF "$(basename "$packed")" <<<"$keep" || hidden_libs+=("$(readlink -f "$origin")")
done <"$checkout/ddp_bundle/MANIFEST"
for must in libmpi.so libhdf5_openmpi.so libopen-pal.so libpmix.so; do
  # A here-string, not a pipe: under pipefail, grep -q leaving early made printf's
  # SIGPIPE the pipeline's status, and a library present was reported missing.
  if ! grep -q "/$must" <<<"$(printf '%s\n' "${hidden_libs[@]}")"; then
    # What was packed, and from what: a library missing from the bundle, or kept
    # back as one the tools below need.
    echo "--- MANIFEST ($(wc -l <"$checkout/ddp_bundle/MANIFEST") libraries)"; cat "$checkout/ddp_bundle/MANIFEST"
    echo "--- ldd $build/ddp_train"; ldd "$build/ddp_train"
    echo "--- kept (needed by this script's tools)"; echo "$keep"
    echo "FAILED: $must would not be hidden" >&2
    exit 1
  fi
done
ompi() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
hidden_dirs=("$(ompi pkglibdir)" "$(ompi pkgdatadir)" "$(ompi sysconfdir)"
             "$(dirname "$(readlink -f "$(ldd "$(readlink -f "$(command -v orterun)")" |
                                            sed -n 's/.*libpmix[^ ]* => \([^ ]*\).*/\1/p')")")")
hidden_programs=("$(readlink -f "$(command -v orterun)")" "$(readlink -f "$(command -v orted)")")
# and cmake, which a GPU node need not have (ctest is its own program)
cmake=$(sed -n 's/^CMAKE_COMMAND:[A-Z]*=//p' "$build/CMakeCache.txt")
[[ -x $cmake ]] && hidden_programs+=("$(readlink -f "$cmake")")

cat >"$tmp/inside.sh" <<EOF
set -euo pipefail
for f in ${hidden_libs[*]} ${hidden_programs[*]}; do mount --bind /dev/null "\$f"; done
for d in ${hidden_dirs[*]} /usr/share/datasets/fashion-mnist; do [[ -d \$d ]] && mount -t tmpfs none "\$d"; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$checkout"
if mpiexec --version >/dev/null 2>&1; then echo "FAILED: the system's mpiexec still runs" >&2; exit 1; fi
if "$build/ddp_train" --version >/dev/null 2>&1; then echo "FAILED: the build's own ddp_train still starts" >&2; exit 1; fi
echo "hidden: ${#hidden_libs[@]} libraries, ${#hidden_dirs[@]} folders, ${#hidden_programs[@]} programs; the system's mpiexec and the build's ddp_train fail"
# The node's python3 (here one that notes its use) runs the tests' python fixtures.
mkdir -p pybin
printf '#!/bin/sh\necho "\$*" >> "%s/pybin/used"\nexec %s "\$@"\n' "$checkout" "$python" > pybin/python3
chmod +x pybin/python3
PATH=$checkout/pybin:\$PATH
source ddp_bundle/env.sh
# The bundle's tests keep their Open MPI session bases apart from the build tree's
# suite, which runs beside this test: its cleanup fixture removes its own alone.
# (the build tree's are /tmp/ddp-<8 hex digits>, the bundle's /tmp/ddp-bundle-<7>)
if grep -rq '/tmp/ddp-[0-9a-f]\{8\}' --include=CTestTestfile.cmake ddp_bundle/build; then
  echo "FAILED: the bundle's CTest files use the build tree's session bases" >&2; exit 1
fi
grep -q 'rm" "-rf" "/tmp/ddp-bundle-[0-9a-f]\{7\}"' ddp_bundle/build/tests/CTestTestfile.cmake ||
  { echo "FAILED: the bundle's cleanup fixture does not remove its own session bases" >&2; exit 1; }
[[ \$(command -v mpiexec) == "$checkout/ddp_bundle/bin/mpiexec" ]] || { echo "FAILED: mpiexec is \$(command -v mpiexec)" >&2; exit 1; }
mpiexec -np 2 --oversubscribe ddp_bundle/build/ddp_train tests/e2e/tiny.nml io.run_dir=runs/tiny 2>&1 | tee train.log
grep -E 'val.*acc' train.log | tail -n 1
grep -qE 'val.*acc' train.log || { echo "FAILED: no validation accuracy from the bundle's ddp_train" >&2; exit 1; }
# The bundle's mpiexec passes SIGUSR1 on to the ranks: they write a checkpoint and
# exit 75 (the stop-and-resume tests send it so). Paced (2 ms a step), so that the
# run is training when the signal comes.
DDP_TEST_STEP_DELAY_US=2000 mpiexec -np 2 --oversubscribe ddp_bundle/build/ddp_train tests/e2e/tiny.nml \\
  io.run_dir=runs/stop train.epochs=1000 > stop.log 2>&1 &
launcher=\$!
for _ in \$(seq 300); do [[ -s runs/stop/metrics.jsonl ]] && break; sleep 0.1; done
kill -USR1 "\$launcher"
rc=0; wait "\$launcher" || rc=\$?
written=\$(sed -n 's/^preempted: checkpoint \\([^ ]*\\) written at step .*; exit 75 for requeue\$/\\1/p' stop.log)
if [[ \$rc != 75 || -z \$written || ! -f \$written ]]; then
  cat stop.log >&2
  echo "FAILED: SIGUSR1 to the bundle's mpiexec: exit \$rc (75 wanted), checkpoint '\$written'" >&2
  exit 1
fi
echo "SIGUSR1 to the bundle's mpiexec: exit 75, \$written"
ctest --test-dir ddp_bundle/build -R '^test_backend_np2\$' --output-on-failure 2>&1 | tee ctest.log
grep -q '100% tests passed, 0 tests failed' ctest.log && grep -qE 'test_backend_np2 \.+ +Passed' ctest.log || { echo "FAILED: test_backend_np2 from the bundle" >&2; exit 1; }
ctest --test-dir ddp_bundle/build -R '^e2e_make_test_data\$' --output-on-failure 2>&1 | tee ctest_python.log
grep -q '100% tests passed, 0 tests failed' ctest_python.log && grep -qE 'e2e_make_test_data \.+ +Passed' ctest_python.log && grep -q make_test_data.py pybin/used ||
  { echo "FAILED: e2e_make_test_data from the bundle with the node's python3" >&2; exit 1; }
# Fashion-MNIST's fixture where its IDX files are not: the packed shards, linked
# where the test runs, are complete.
ctest --test-dir ddp_bundle/build -R '^e2e_prepare_fashion_mnist\$' --output-on-failure 2>&1 | tee ctest_fashion.log
grep -q '100% tests passed, 0 tests failed' ctest_fashion.log && grep -qE 'e2e_prepare_fashion_mnist \.+ +Passed' ctest_fashion.log && grep -q prepare_fashion_mnist pybin/used ||
  { echo "FAILED: e2e_prepare_fashion_mnist from the bundle's shards" >&2; exit 1; }
# A training test (2 ranks of ddp_train through the bundle's mpiexec, checked by
# its python), where cmake is not.
ctest --test-dir ddp_bundle/build -R '^e2e_tiny_np3\$' --output-on-failure 2>&1 | tee ctest_train.log
grep -q '100% tests passed, 0 tests failed out of' ctest_train.log ||
  { echo "FAILED: e2e_tiny_np3 from the bundle where cmake is not" >&2; exit 1; }
# A library missing from both: env.sh names the program and the library.
rm ddp_bundle/lib/libmpi.so.40
missing=\$(source ddp_bundle/env.sh 2>&1)
echo "\$missing"
grep -q '^ddp_bundle: build/ddp_train cannot start on this node: .*libmpi.so.40' <<<"\$missing" ||
  { echo "FAILED: env.sh does not name ddp_train's missing libmpi.so.40" >&2; exit 1; }
EOF
unshare --mount --propagation private bash "$tmp/inside.sh"
echo "bundle_gpu_test: passed"
