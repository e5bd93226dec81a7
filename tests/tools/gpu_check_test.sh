#!/usr/bin/env bash
# tools/gpu_check off a GPU node: its one-line refusals (no part, a CPU build, a
# build without the part's programs, no GPU, the bundle's build without its env.sh),
# and the verdict of its tests and nccl parts, read
# from a real ctest run of a made-up build tree whose tests pass, fail and skip (exit
# 77, as a GPU test without its device), with a stand-in nvidia-smi that names a GPU.
# usage: gpu_check_test.sh SOURCE_DIR BUILD_DIR (the CPU build)
set -u
src=$1
cpu_build=$2
tool=$src/tools/gpu_check
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# expect CODE 'TEXT' [VAR=value ...] -- ARGS: the tool's exit code, and TEXT as its last line
expect() {
  local code=$1 text=$2 env=()
  shift 2
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  local out got
  out=$(env "${env[@]}" "$tool" "$@" 2>&1)
  got=$?
  local last
  last=$(printf '%s\n' "$out" | tail -n 1)
  if [[ $got == "$code" && $last == "$text" ]]; then
    echo "ok: gpu_check $* -> $code: $last"
  else
    echo "FAIL: gpu_check $* (${env[*]}): exit $got, last line '$last'; want $code, '$text'"
    printf '%s\n' "$out" | tail -n 8 | sed 's/^/  | /'
    failures=$((failures + 1))
  fi
}

# A made-up GPU build tree: the tests part's programs (stand-ins) and tests whose
# names the default list matches, and one it does not.
tree=$work/build-gpu
mkdir -p "$tree/tests" "$work/gpu-bin" "$work/no-gpu-bin"
for p in ddp_train ddp_bench bn_bench; do printf '#!/bin/sh\nexit 0\n' > "$tree/$p"; done
for p in step_compare gpu_selftest layers_precision_test layers_narrow_test layers_library_batchnorm_test \
         layers_conv_stats_test model_layers_test model_loss_test test_step_graph; do
  printf '#!/bin/sh\nexit 0\n' > "$tree/tests/$p"
done
chmod +x "$tree"/* "$tree"/tests/*
cat > "$tree/CTestTestfile.cmake" <<'CT'
add_test(gpu_step_compare "/bin/sh" "-c" "echo 'no CUDA device'; exit 77")
set_tests_properties(gpu_step_compare PROPERTIES SKIP_RETURN_CODE 77)
add_test(layers_narrow_test "/bin/true")
add_test(model_layers_test "/bin/sh" "-c" "echo 'a layer off by 1e-3'; exit 1")
add_test(checkpoint_cpu_only "/bin/false")
add_test(gpu_nccl_slow "/bin/sleep" "60")
add_test(e2e_make_test_data "/bin/true")
set_tests_properties(e2e_make_test_data PROPERTIES FIXTURES_SETUP e2e_data)
add_test(gpu_nccl_selftest_np2 "/bin/true")
add_test(gpu_nccl_equal_np2 "/bin/sh" "-c" "echo 'NCCL against MPI: off by 1e-2'; exit 1")
set_tests_properties(gpu_nccl_selftest_np2 gpu_nccl_equal_np2 PROPERTIES FIXTURES_REQUIRED e2e_data)
add_test(layers_grad_test "/bin/sh" "-c" "echo '[  SKIPPED ] Attention.FusedOptionOnTheHost (0 ms)'; [ -z \"$FUSED_SKIPS\" ] || echo '[  SKIPPED ] Attention.FusedAgreesWithBlocksOnTheGpu (0 ms)'")
CT
printf '#!/bin/sh\necho "NVIDIA H200"\n' > "$work/gpu-bin/nvidia-smi"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver" >&2\nexit 9\n' \
  > "$work/no-gpu-bin/nvidia-smi"
chmod +x "$work/gpu-bin/nvidia-smi" "$work/no-gpu-bin/nvidia-smi"
gpu_path=PATH=$work/gpu-bin:$PATH
no_gpu_path=PATH=$work/no-gpu-bin:$PATH

expect 2 "usage: tools/gpu_check tests|nccl|table|split|switches|convs|transformers|vit   (tools/gpu_check --programs: what to bundle)" --
expect 2 "usage: tools/gpu_check tests|nccl|table|split|switches|convs|transformers|vit   (tools/gpu_check --programs: what to bundle)" -- bench
expect 2 "gpu_check tests: $cpu_build is a CPU build (DDP_ENABLE_CUDA is not ON in its CMakeCache.txt): give the GPU build (BUILD_DIR)" \
  BUILD_DIR="$cpu_build" "$gpu_path" -- tests
expect 2 "gpu_check tests: $work is not a build tree (BUILD_DIR; on the node: source ddp_bundle/env.sh first)" \
  BUILD_DIR="$work" "$gpu_path" -- tests
rm "$tree/tests/model_layers_test" "$tree/bn_bench"
expect 2 "gpu_check tests: $tree lacks model_layers_test (bundle them: tools/bundle_gpu OUT \$(tools/gpu_check --programs))" \
  BUILD_DIR="$tree" "$gpu_path" -- tests
expect 2 "gpu_check switches: $tree lacks bn_bench (bundle them: tools/bundle_gpu OUT \$(tools/gpu_check --programs))" \
  BUILD_DIR="$tree" "$gpu_path" -- switches
expect 2 "gpu_check convs: $tree lacks cudnn_conv_bench (bundle them: tools/bundle_gpu OUT \$(tools/gpu_check --programs))" \
  BUILD_DIR="$tree" "$gpu_path" -- convs
expect 2 "gpu_check transformers: $tree lacks layers_grad_test (bundle them: tools/bundle_gpu OUT \$(tools/gpu_check --programs))" \
  BUILD_DIR="$tree" "$gpu_path" -- transformers
printf '#!/bin/sh\nexit 0\n' > "$tree/tests/model_layers_test"
printf '#!/bin/sh\nexit 0\n' > "$tree/tests/layers_grad_test"
chmod +x "$tree/tests/model_layers_test" "$tree/tests/layers_grad_test"
# transformers' tests: the host's test skipped on a GPU build is expected; the fused
# kernels' comparison skipped (no kernels for the GPU) fails the part.
expect 0 "gpu_check transformers: passed: tests (layers_grad_test, none of it skipped; attention's memory; GPT-2 124M's table; the switches' rounds)" \
  BUILD_DIR="$tree" "$gpu_path" TRANSFORMERS_STEPS=tests -- transformers
expect 1 "gpu_check transformers: 1 part(s) failed (their lines above)" \
  BUILD_DIR="$tree" "$gpu_path" TRANSFORMERS_STEPS=tests FUSED_SKIPS=1 -- transformers
expect 2 "gpu_check tests: nvidia-smi finds no GPU on $(hostname): run it on a GPU node" \
  BUILD_DIR="$tree" "$no_gpu_path" -- tests
# The verdict: a skipped test is a GPU test that did not see its device, a failure here.
expect 1 "gpu_check tests: 1 of 3 passed on NVIDIA H200; failed: model_layers_test; skipped (no device seen): gpu_step_compare" \
  BUILD_DIR="$tree" "$gpu_path" -- tests
expect 1 "gpu_check tests: 1 of 2 passed on NVIDIA H200; skipped (no device seen): gpu_step_compare" \
  BUILD_DIR="$tree" "$gpu_path" GPU_TESTS='^(gpu_step_compare|layers_narrow_test)$' -- tests
expect 0 "gpu_check tests: 1 of 1 passed on NVIDIA H200" \
  BUILD_DIR="$tree" "$gpu_path" GPU_TESTS='^layers_narrow_test$' -- tests
expect 1 "gpu_check tests: no test of $tree matches ^nothing$" \
  BUILD_DIR="$tree" "$gpu_path" GPU_TESTS='^nothing$' -- tests
# A part that passes its time limit ends then, with the verdict of what ran.
t0=$SECONDS
expect 1 "gpu_check nccl: 0 of 0 passed on NVIDIA H200; stopped at its limit of 2 s (PART_LIMIT_S), the tests after not run" \
  BUILD_DIR="$tree" "$gpu_path" GPU_TESTS='^gpu_nccl_slow$' PART_LIMIT_S=2 -- nccl
((SECONDS - t0 < 20)) || { echo "FAIL: the nccl part took $((SECONDS - t0)) s past a limit of 2 s"; failures=$((failures + 1)); }
# nccl: one ctest a test in NCCL_ORDER's order, each counted once (not the fixture
# each run repeats); a name no test has is a failure, named.
expect 1 "gpu_check nccl: 1 of 2 passed on NVIDIA H200; failed: gpu_nccl_equal_np2 (no such test: ^gpu_nccl_missing_np9\$)" \
  BUILD_DIR="$tree" "$gpu_path" NCCL_ORDER="selftest_np2 equal_np2 missing_np9" -- nccl
# The bundle's build tree without its env.sh sourced: one line, before any test.
mkdir -p "$work/ddp_bundle"
cp -r "$tree" "$work/ddp_bundle/build"
expect 2 "gpu_check tests: $work/ddp_bundle/build is the bundle's, and its env.sh is not sourced in this shell: source ddp_bundle/env.sh first" \
  BUILD_DIR="$work/ddp_bundle/build" "$gpu_path" OPAL_PREFIX= -- tests
# --programs names what the parts run, for tools/bundle_gpu.
programs=$("$tool" --programs)
for p in ddp_train ddp_bench bn_bench step_compare gpu_selftest model_layers_test; do
  [[ " $programs " == *" $p "* ]] || { echo "FAIL: --programs lacks $p: $programs"; failures=$((failures + 1)); }
done
((failures == 0)) || { echo "gpu_check_test: $failures failure(s)"; exit 1; }
echo "gpu_check_test: all passed"
