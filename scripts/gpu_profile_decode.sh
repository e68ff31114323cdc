#!/usr/bin/env bash
# Where a decode step of the GLM-5.3 slice goes, kernel by kernel, in one device call: Nsight Compute over one
# CUDA-graph replay of batch B (realwidth_gpu_bench --profile-batch: the step between cudaProfilerStart /
# Stop, so nothing of the start-up is profiled), each kernel timed alone (gpu__time_duration), the clocks and
# caches left as they are. Run from the repository root through the device tool with
#   carry: [".deps", ".fixtures"]   (scripts/fetch_gpu_deps.sh, scripts/stage_fixtures.sh)
#   bash scripts/gpu_profile_decode.sh [B [CONTEXT [KV]]] [extra realwidth_gpu_bench flags...]
# defaults: batch 1, context 4096, fp8_e4m3; the positional values are taken while they do not start with
# "--". One --pdl value at most (each value profiles a step of its own). Writes $OUT/profile/ncu.csv
# (scripts/ncu_kernels.py reads it here too) and prints the step's time through its graph, then the
# per-kernel summary.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
LOG=$OUT/profile
mkdir -p "$LOG"
B=1
CTX=4096
KV=fp8_e4m3
[ $# -gt 0 ] && [ "${1#--}" = "$1" ] && { B=$1; shift; }
[ $# -gt 0 ] && [ "${1#--}" = "$1" ] && { CTX=$1; shift; }
[ $# -gt 0 ] && [ "${1#--}" = "$1" ] && { KV=$1; shift; }
source scripts/gpu_build.sh
gpu_build "$LOG" realwidth_gpu_bench | sed 's/^build:/=== build:/' || exit 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
timeout 240 "$NCU" --profile-from-start off --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv --print-units base \
  build-gpu/bench/realwidth_gpu_bench --prefill none --batches "$B" --contexts "$CTX" --kv "$KV" \
  --verify-tokens 0 --steps 5 --trace-batch 0 --profile-batch "$B" "$@" >"$LOG/ncu.csv" 2>"$LOG/ncu.err"
echo "=== ncu rc=$? (step through its graph, unprofiled:)"
grep -h "^ROW decode" "$LOG/ncu.csv" || tail -5 "$LOG/ncu.err"
python3 scripts/ncu_kernels.py "$LOG/ncu.csv"
