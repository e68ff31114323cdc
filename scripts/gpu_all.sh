#!/usr/bin/env bash
# Everything in one device call, each part under its own time limit so one slow part cannot eat the
# call: build + every GPU test (scripts/gpu.sh), the two GPU benchmarks, then the serve check
# (scripts/gpu_serve_check.sh). Run from the repository root through the device tool with
#   carry: [".deps", ".fixtures"]
# Limits (seconds, env): TEST_S (default 330), BENCH_S (75 per benchmark; BENCHES names them), SERVE_S (150;
# SERVE=0 skips it), EXTRA_S (90, for the optional EXTRA command).
# A first call on a bare machine spends ~150 s of TEST_S building. Logs under $OUT; prints a summary.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
export OUT
mkdir -p "$OUT"
T0=$(date +%s)
GPU_BENCH=0 GPU_TARGETS="cuda_kernels_test dist_cuda_test ops_gpu_bench attention_gpu_bench dsaserve serve_cuda_test" \
  timeout "${TEST_S:-330}" bash scripts/gpu.sh "${REGEX:-^(Cuda|Fixtures/Cuda|Indexer|MlaDecode)}" >"$OUT/gpu_sh.txt" 2>&1
echo "gpu.sh rc=$? after $(($(date +%s) - T0)) s (124: cut by TEST_S; see ctest.log for the tests that ran)"
grep -E "tests passed|tests failed" "$OUT/ctest.log"
grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Exception" "$OUT/ctest.log" | head -30
for b in ${BENCHES-ops_gpu_bench attention_gpu_bench}; do
  timeout "${BENCH_S:-75}" build-gpu/bench/$b >"$OUT/$b.txt" 2>&1
  echo "$b rc=$? after $(($(date +%s) - T0)) s"
done
# EXTRA (optional): one more command line (e.g. a profiler run) under EXTRA_S seconds, logged to extra.txt.
if [ -n "${EXTRA:-}" ]; then
  timeout "${EXTRA_S:-90}" bash -c "$EXTRA" >"$OUT/extra.txt" 2>&1
  echo "extra rc=$? after $(($(date +%s) - T0)) s"
fi
if [ "${SERVE:-1}" = 1 ]; then
  timeout "${SERVE_S:-150}" bash scripts/gpu_serve_check.sh >"$OUT/serve_check.txt" 2>&1
  echo "serve rc=$? after $(($(date +%s) - T0)) s"
  tail -25 "$OUT/serve_check.txt"
fi
