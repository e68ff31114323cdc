#!/usr/bin/env bash
# The one GPU script: run on the GPU machine through the device tool, from the repository root, with
#   carry: [".deps", ".fixtures"]   (scripts/fetch_gpu_deps.sh and scripts/stage_fixtures.sh make them)
# It unpacks the carried Debian packages into a prefix, builds the CUDA targets (sm_90a), runs every GPU
# test (and the GPU benchmarks when they exist), writes full logs under $OUT and prints a short table last.
# Usage: bash scripts/gpu.sh [ctest regex, default: the CUDA tests]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
mkdir -p "$OUT"
source scripts/gpu_build.sh
# Targets: $GPU_TARGETS (default: the CUDA test binary), so work in progress elsewhere does not block.
# shellcheck disable=SC2086
gpu_build "$OUT" ${GPU_TARGETS:-cuda_kernels_test} || exit 1
regex=${1:-Cuda}
(cd build-gpu && ctest -R "$regex" --output-on-failure --timeout 600 -j1 ) >"$OUT/ctest.log" 2>&1
rc=$?
# Per-test measured numbers: every GPU test prints lines starting with "RESULT " (op, error, timing).
grep -h "^RESULT " "$OUT/ctest.log" build-gpu/Testing/Temporary/LastTest.log 2>/dev/null | sort -u > "$OUT/results.txt"
# GPU_BENCH=0 skips the benchmarks (run them separately, e.g. each under its own timeout).
if [ "${GPU_BENCH:-1}" = 1 ]; then
  for b in build-gpu/bench/*_gpu_bench; do [ -x "$b" ] && "$b" | tee -a "$OUT/bench.txt"; done
fi
echo "=== GPU tests ($regex): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "Passed|Failed|Skipped|\*\*\*" "$OUT/ctest.log" | sed 's/^ *//' | head -80
[ -s "$OUT/results.txt" ] && { echo "=== results"; cat "$OUT/results.txt"; }
exit $rc
