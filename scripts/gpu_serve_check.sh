#!/usr/bin/env bash
# issue 7 on the GPU machine: `dsaserve serve --device cuda` end to end. Run from the repository root through
# the device tool with
#   carry: [".deps", ".fixtures"]
# made here by scripts/fetch_gpu_deps.sh, scripts/stage_boost.sh (the server's Boost headers) and
# scripts/stage_fixtures.sh (needs models/realdims). Steps, each logged under $OUT/serve/ (a failing step
# does not stop the next ones):
#   1. setup and build (scripts/gpu.sh's: carried debs and Boost, build-gpu; incremental when gpu.sh ran
#      first): targets dsaserve serve_cuda_test
#   2. the GPU serve tests (ctest -R 'ServeCuda|ServeDevice')
#   3. `dsaserve serve --device cuda --model <realdims> --tokenizer builtin:bytes` with the KV pool sized
#      from free device memory; one chat request (and one streamed) with curl; the server log
#   4. the serving benchmark (bench/serve_bench.py --device cuda) at concurrency 1, 8, 32, 64, then again
#      with --sampling-device gpu at concurrency 1 and 32
# Bounded: at most ~5 minutes after the build (200 s tests, ~45 s serve, 50 + 35 s bench), typically ~2.
# Exit status: the tests' (0 when all pass), or 1 when the build or the chat request failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
LOG=$OUT/serve
mkdir -p "$LOG"
source scripts/gpu_build.sh
# 1. Build.
if [ ! -f /usr/include/boost/version.hpp ] && [ ! -f .deps/boost-headers.tar.xz ]; then
  echo "no Boost on this machine and no .deps/boost-headers.tar.xz (run scripts/stage_boost.sh)"
  exit 1
fi
gpu_build "$LOG" dsaserve serve_cuda_test | sed 's/^build:/=== build:/' || exit 1
BIN=$PWD/build-gpu/src/cli/dsaserve
FIX=$PWD/.fixtures/models/realdims
[ -f "$FIX/config.json" ] || echo "warning: $FIX missing (scripts/stage_fixtures.sh realdims): fixture tests skip"

# 2. GPU serve tests.
t=$(date +%s)
(cd build-gpu && timeout 200 ctest -R 'ServeCuda|ServeDevice' -E OnCpu --output-on-failure --timeout 100 -j1) >"$LOG/ctest.log" 2>&1
rc=$?
echo "=== serve GPU tests ($(( $(date +%s) - t )) s, rc $rc): $(grep -E 'tests passed|tests failed' "$LOG/ctest.log")"
grep -E "Passed|Failed|Skipped|\*\*\*|Timeout" "$LOG/ctest.log" | sed 's/^ *//' | head -20
grep -h "^RESULT " "$LOG/ctest.log" build-gpu/Testing/Temporary/LastTest.log 2>/dev/null | sort -u | tee "$LOG/results.txt"

# 3. One server, one chat request (plain and streamed).
echo "=== serve --device cuda (realdims, KV pool from --mem-fraction-static 0.3)"
t=$(date +%s)
"$BIN" serve --device cuda --model "$FIX" --tokenizer builtin:bytes --served-model-name realdims --port 0 \
  --kv-pages 0 --mem-fraction-static 0.3 >"$LOG/serve.log" 2>&1 &
spid=$!
port=""
for _ in $(seq 1 100); do
  port=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$LOG/serve.log" | grep -o "[0-9]*$")
  [ -n "$port" ] && break
  kill -0 $spid 2>/dev/null || break
  sleep 0.2
done
chat_rc=1
if [ -n "$port" ]; then
  body='{"model":"realdims","messages":[{"role":"user","content":"Hello from the H200"}],"max_tokens":16,"temperature":0,"ignore_eos":true}'
  sbody='{"model":"realdims","messages":[{"role":"user","content":"Hello again"}],"max_tokens":8,"temperature":0,"stream":true}'
  if command -v curl >/dev/null; then
    curl -sS -m 12 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$LOG/chat.json"
    chat_rc=$?
    curl -sS -m 12 -N "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$sbody" >"$LOG/chat_stream.txt"
    curl -sS -m 5 "http://127.0.0.1:$port/metrics" >"$LOG/metrics.txt"
  else
    python3 - "$port" "$body" "$sbody" "$LOG" <<'PY'
import sys, urllib.request
port, body, sbody, log = sys.argv[1:5]
def post(b):
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b.encode(),
                               headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(r, timeout=12).read().decode()
open(f"{log}/chat.json", "w").write(post(body))
open(f"{log}/chat_stream.txt", "w").write(post(sbody))
open(f"{log}/metrics.txt", "w").write(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
PY
    chat_rc=$?
  fi
  grep -q '"chat.completion"' "$LOG/chat.json" 2>/dev/null || chat_rc=1
fi
kill -TERM $spid 2>/dev/null
for _ in $(seq 1 25); do kill -0 $spid 2>/dev/null || break; sleep 0.2; done
kill -KILL $spid 2>/dev/null
wait $spid 2>/dev/null
echo "--- server log"; cat "$LOG/serve.log"
echo "--- chat response (rc $chat_rc)"; cat "$LOG/chat.json" 2>/dev/null; echo
echo "--- streamed: $(grep -c '^data: ' "$LOG/chat_stream.txt" 2>/dev/null) events, last: $(grep '^data: ' "$LOG/chat_stream.txt" 2>/dev/null | tail -2 | head -1 | cut -c1-200)"
echo "--- ($(( $(date +%s) - t )) s)"

# 4. Serving benchmark: one server, concurrency 1/8/32/64, 4 requests per client, outputs up to 64 tokens.
echo "=== serving bench (realdims, --device cuda)"
t=$(date +%s)
PYTHONUNBUFFERED=1 timeout 50 python3 bench/serve_bench.py --dsaserve "$BIN" --device cuda \
  --concurrency-list 1,8,32,64 --requests-per-client 4 --prompt-len 256 --output-len 64 -- \
  --model "$FIX" --tokenizer builtin:bytes --kv-pages 4096 --max-running-requests 64 \
  >"$LOG/bench.txt" 2>"$LOG/bench_serve.log"
echo "bench rc $? ($(( $(date +%s) - t )) s)"
grep -A6 "^concurrency" "$LOG/bench.txt" || tail -30 "$LOG/bench.txt"
grep "dsaserve serve:" "$LOG/bench_serve.log" | head -5
# The same server sampling on the GPU (--sampling-device gpu) at concurrency 1 and 32, to compare.
echo "=== serving bench (realdims, --device cuda --sampling-device gpu)"
t=$(date +%s)
PYTHONUNBUFFERED=1 timeout 35 python3 bench/serve_bench.py --dsaserve "$BIN" --device cuda \
  --concurrency-list 1,32 --requests-per-client 4 --prompt-len 256 --output-len 64 -- \
  --model "$FIX" --tokenizer builtin:bytes --kv-pages 4096 --max-running-requests 64 --sampling-device gpu \
  >"$LOG/bench_gpu_sampling.txt" 2>"$LOG/bench_gpu_sampling_serve.log"
echo "bench (gpu sampling) rc $? ($(( $(date +%s) - t )) s)"
grep -A6 "^concurrency" "$LOG/bench_gpu_sampling.txt" || tail -30 "$LOG/bench_gpu_sampling.txt"
[ $chat_rc -eq 0 ] || { echo "the chat request failed"; exit 1; }
exit $rc
