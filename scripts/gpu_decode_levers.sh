#!/usr/bin/env bash
# The batch-1 decode levers of 2026-12-07 (issue 15) checked and measured in one device call: builds the GPU
# test binary and the two benchmarks, runs the tests of what changed (the fused small-T launches, the absorbed
# projections' small-T kernel, the deeper FP8 pipeline, RoPE over head groups, the norms' and cache writes'
# hoisted loads: their kernel tests and op-table cases), then `ops_gpu_bench fuse` (linear_multi's pairs in
# one launch or two; absorb_q / absorb_v through cuBLASLt or the small-T kernel), `ops_gpu_bench stages` (the
# FP8 small-T kernel's pipeline depth and bulk-copy staging) and the GLM-5.3 slice's
# decode rows with every pair of KernelOptions::gemm_small_fuse x absorb_small_max_tokens (FP8 KV, context 4K,
# batch 1 / 8 / 32). Those decided the two options' defaults (2026-12-08, an H100: the fused launches on, the
# absorbed small-T kernel off), so they run right after the tests, before the two micro-benchmarks. Logs under $OUT (levers_*.txt); each part under its own time limit.
# Run from the repository root through the device tool with carry [".deps", ".fixtures"]:
#   bash scripts/gpu_decode_levers.sh
# or, without the ~100 s build there (scripts/stage_prebuilt.sh, then scripts/stage_fixtures.sh tiny realdims_fp8
# into an emptied .fixtures), carry [".fixtures", ".prebuilt"] (the prebuilt binaries bring their runtime packages):
#   GPU_PREBUILT=1 bash scripts/gpu_decode_levers.sh
# The hoisted loads and RoPE's grid are on every path (no option): their before / after is the kernels' times
# in scripts/gpu_profile_decode.sh against the README's batch-1 profile, or scripts/gpu_ab.sh against
# `scripts/stage_base.sh e900224`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/dsaserve-gpu-out}
mkdir -p "$OUT"
start=$SECONDS
# shellcheck disable=SC1091
source scripts/gpu_build.sh
gpu_build "$OUT" cuda_kernels_test realwidth_gpu_bench ops_gpu_bench || exit 1
B=build-gpu
F='CudaFp8SmallGemm.*:CudaAbsorbSmall.*:CudaMlaFused.*:CudaOps/CudaOpTable.*rms_norm*'
F="$F:CudaOps/CudaOpTable.*norm_fp8*:CudaOps/CudaOpTable.*rope*:CudaOps/CudaOpTable.*absorb*"
F="$F:CudaOps/CudaOpTable.*linear_multi*:CudaOps/CudaOpTable.*layer_norm*:CudaOps/CudaOpTable.*write*"
F="$F:Fixtures/CudaGoldens.*:CudaDecodeStep.*"
timeout 200 "$B/tests/kernels/cuda/cuda_kernels_test" --gtest_filter="$F" --gtest_brief=1 >"$OUT/levers_tests.txt" 2>&1
echo "=== tests rc=$? at $((SECONDS - start)) s"
grep -E "PASSED|FAILED|Failure|tests ran" "$OUT/levers_tests.txt" | head -30
timeout 180 "$B/bench/realwidth_gpu_bench" --prefill none --batches 1,8,32 --contexts 4096 --kv fp8_e4m3 \
  --verify-tokens 0 --steps 10 --trace-batch 0 --small-fuse 0,1 --absorb-small-max-tokens 0,8 \
  >"$OUT/levers_realwidth.txt" 2>&1
echo "=== realwidth_gpu_bench rc=$? at $((SECONDS - start)) s"
grep -E "^ROW|rror" "$OUT/levers_realwidth.txt"
timeout 60 "$B/bench/ops_gpu_bench" fuse >"$OUT/levers_fuse.txt" 2>&1
echo "=== ops_gpu_bench fuse rc=$? at $((SECONDS - start)) s"
grep "|" "$OUT/levers_fuse.txt"
timeout 60 "$B/bench/ops_gpu_bench" stages >"$OUT/levers_stages.txt" 2>&1
echo "=== ops_gpu_bench stages rc=$? at $((SECONDS - start)) s"
grep "|" "$OUT/levers_stages.txt"
