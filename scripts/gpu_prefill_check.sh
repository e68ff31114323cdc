#!/usr/bin/env bash
# issue 15, the prefill path's small ops (the f32-activation kernel, absorb_v_fp8, silu_mul_fp8), in one device
# call: run from the repository root through the device tool with
#   carry: [".deps", ".fixtures"]   (scripts/fetch_gpu_deps.sh, scripts/stage_boost.sh, scripts/stage_fixtures.sh)
# Steps, logged under $OUT/prefill/ (a failing step does not stop the next):
#   1. build cuda_kernels_test, ops_gpu_bench, realwidth_gpu_bench (scripts/gpu_build.sh)
#   2. the GPU tests of the changed ops: the kernel against its exact sums, the operators against the paths they
#      replace and the CPU, the op table's prefill / absorb / silu cases (T = 1 .. 4096), the forward's goldens and
#      decode steps
#   3. ops_gpu_bench prefill: each changed op, old path / new / default, T = 1 .. 16,384
#   4. realwidth_gpu_bench prefill rows (4K and 16K tokens, FP8 and bf16 KV) and batch 1 / 32 decode: the new
#      paths (defaults, with the traced 4K prefill), then the old ones (every new path off by KernelOptions)
# Limits (seconds, env): TEST_S (240), OPS_S (90), RW_S (each realwidth run, 120); 0 skips a step (the device call
# limit is 600 s and a bare machine spends ~150-250 s building: on a warm machine the build is a no-op, so
# e.g. one call with RW_S=0 and a second with TEST_S=0 OPS_S=0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
LOG=$OUT/prefill
mkdir -p "$LOG"
T0=$(date +%s)
source scripts/gpu_build.sh
gpu_build "$LOG" cuda_kernels_test ops_gpu_bench realwidth_gpu_bench | sed 's/^build:/=== build:/' || exit 1
CFG=$PWD/.fixtures/configs/glm-5.3.json

# 2. GPU tests.
if [ "${TEST_S:-240}" != 0 ]; then
filter='CudaF32ActGemm.*:CudaSiluFp8.*:CudaMlaFused.AbsorbBatchedMatchesCpu:CudaFp8SmallGemm.LinearMultiEqualsSeparateLinears'
filter+=':CudaFp8SmallGemm.Bf16SmallKernelIsTheExactTwoTermSum:CudaFp8SmallGemm.NormFp8CopyIsTheQuantisationOfItsOutput'
filter+=':CudaOps/CudaOpTable.MatchesCpu/*prefill*:CudaOps/CudaOpTable.MatchesCpu/*absorb*'
filter+=':CudaOps/CudaOpTable.MatchesCpu/*silu*'
filter+=':Fixtures/CudaGoldens.*:CudaDecodeStep.*'  # the forward with silu_mul_fp8 / absorb_v_fp8 in it
timeout "${TEST_S:-240}" build-gpu/tests/kernels/cuda/cuda_kernels_test --gtest_filter="$filter" >"$LOG/tests.log" 2>&1
echo "=== GPU tests: $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOG/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|FAIL" "$LOG/tests.log" | head -20
grep -h "^RESULT " "$LOG/tests.log" > "$LOG/results.txt"
fi

# 3. The changed ops, old / new.
if [ "${OPS_S:-90}" != 0 ]; then
timeout "${OPS_S:-90}" build-gpu/bench/ops_gpu_bench prefill > "$LOG/ops.txt" 2>&1
echo "=== ops_gpu_bench prefill"
grep -E "^\|" "$LOG/ops.txt"
fi

# 4. The slice: new paths (defaults), then every new path off.
if [ "${RW_S:-120}" != 0 ]; then
rw=(build-gpu/bench/realwidth_gpu_bench --config "$CFG" --prefill 4096,16384 --kv fp8_e4m3,bf16 --batches 1,32
  --contexts 4096 --trace-batch 0 --verify-tokens 1 --steps 5 --max-seconds $((${RW_S:-120} - 20)))
timeout "${RW_S:-120}" "${rw[@]}" --trace-prefill 4096 > "$LOG/realwidth_new.txt" 2>&1
timeout "${RW_S:-120}" "${rw[@]}" --trace-prefill 0 --split-fused-min-tokens 0 --absorb-fused-min-tokens 0 \
  --silu-mul-fp8-copy 0 > "$LOG/realwidth_old.txt" 2>&1
echo "=== realwidth (new paths: defaults)"
grep -E "^ROW" "$LOG/realwidth_new.txt"
echo "=== realwidth (old paths: --split-fused-min-tokens 0 --absorb-fused-min-tokens 0 --silu-mul-fp8-copy 0)"
grep -E "^ROW|kernel options" "$LOG/realwidth_old.txt"
echo "=== traced 4K prefill (new paths; full table in $LOG/realwidth_new.txt)"
sed -n '/^OPS /,/^ROW\|^SKIP\|^done/p' "$LOG/realwidth_new.txt" | head -60
fi
echo "=== done after $(($(date +%s) - T0)) s"
