#!/usr/bin/env bash
# issue 15 on the GPU machine, in one device call (under 10 minutes): GLM-5.3 at its real widths. Run from
# the repository root through the device tool with
#   carry: [".deps", ".fixtures"]   (scripts/fetch_gpu_deps.sh, scripts/stage_boost.sh, scripts/stage_fixtures.sh)
# Steps, logged under $OUT/realwidth/ (a failing step does not stop the next):
#   1. build dsaserve, cuda_kernels_test and realwidth_gpu_bench (scripts/gpu_build.sh)
#   2. the CUDA dummy-weight tests (CudaDummy.*: the GPU fill equals the CPU's bytes; the indexer row split)
#   3. `serve --device cuda --load-format dummy --model glm-5.3.json --json-model-override-args
#      '{"num_hidden_layers": 8}'` with the default flags: the start-up lines (memory split), one chat and one
#      completion request
#   4. bench/realwidth_gpu_bench (decode / prefill rows vs the plan, the per-op table) in the time left
# Limits (seconds, env): SERVE_S (240), BENCH_S (what is left of TOTAL_S, default 560:
# the device call limit is 600 s; a bare machine spends ~150 s of it building).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
LOG=$OUT/realwidth
mkdir -p "$LOG"
T0=$(date +%s)
source scripts/gpu_build.sh
gpu_build "$LOG" dsaserve cuda_kernels_test realwidth_gpu_bench | sed 's/^build:/=== build:/' || exit 1
BIN=$PWD/build-gpu/src/cli/dsaserve
CFG=$PWD/.fixtures/configs/glm-5.3.json

# 2. Dummy-weight GPU tests.
(cd build-gpu && timeout 120 ctest -R 'CudaDummy' --output-on-failure --timeout 100 -j1) >"$LOG/ctest.log" 2>&1
echo "=== CudaDummy tests: $(grep -E 'tests passed|tests failed' "$LOG/ctest.log")"
grep -h "^RESULT " "$LOG/ctest.log" | sort -u

# 3. serve with the default flags.
echo "=== serve --device cuda --load-format dummy (glm-5.3 x 8 layers, default flags)"
t=$(date +%s)
"$BIN" serve --device cuda --load-format dummy --model "$CFG" --json-model-override-args '{"num_hidden_layers": 8}' \
  --port 0 >"$LOG/serve.log" 2>&1 &
spid=$!
port=""
for _ in $(seq 1 $((${SERVE_S:-240} * 5))); do
  port=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$LOG/serve.log" | grep -o "[0-9]*$")
  [ -n "$port" ] && break
  kill -0 $spid 2>/dev/null || break
  sleep 0.2
done
if [ -n "$port" ]; then
  curl -sS -m 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}' >"$LOG/chat.json"
  curl -sS -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hello","max_tokens":8}' >"$LOG/completion.json"
fi
kill -TERM $spid 2>/dev/null
for _ in $(seq 1 50); do kill -0 $spid 2>/dev/null || break; sleep 0.2; done
kill -KILL $spid 2>/dev/null
wait $spid 2>/dev/null
cat "$LOG/serve.log" | head -20
echo "--- chat: $(head -c 400 "$LOG/chat.json" 2>/dev/null)"
echo "--- completion: $(head -c 400 "$LOG/completion.json" 2>/dev/null)"
echo "--- ($(($(date +%s) - t)) s)"

# 4. The benchmark in the time left (rows print as they finish).
left=$((${TOTAL_S:-560} - ($(date +%s) - T0)))
echo "=== realwidth_gpu_bench (${BENCH_S:-$left} s)"
timeout "${BENCH_S:-$left}" build-gpu/bench/realwidth_gpu_bench --config "$CFG" \
  --max-seconds $((${BENCH_S:-$left} - 30)) 2>&1 | tee "$LOG/bench.txt"
echo "=== done after $(($(date +%s) - T0)) s"
