#!/usr/bin/env bash
# Sanitizer and fuzz pass (part of scripts/test.sh, so CI runs it). Two clang builds, CPU only:
#  build-asan (AddressSanitizer + UndefinedBehaviorSanitizer, libFuzzer coverage): the input parsers'
#    tests, server_test and serve_e2e_test (which starts the real dsaserve binary, built with the sanitizers),
#    then every libFuzzer target for FUZZ_SECONDS (default 20) each on its seed corpus (tests/fuzz/corpus),
#    from FUZZ_SEED (default 1: a CI run explores the same inputs as the last one did; FUZZ_SEED=0 is
#    libFuzzer's random seed, for hunting):
#    safetensors files, raw HTTP bytes against the in-process server, request JSON -> generation
#    parameters, chat templates, the tokenizer.
#  build-tsan (ThreadSanitizer): the server's unit tests and its end-to-end tests (the server's I/O,
#    preparation, engine, runner and pump threads under TSan).
# SANITIZE_SKIP_TSAN=1 skips the second build. Non-zero exit on any failure, sanitizer report or crash.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
FUZZ_SEED=${FUZZ_SEED:-1}
# -O1 -g1: what the sanitizers' reports need; the builds are the costly part on 2 cores.
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1" "-DCMAKE_C_FLAGS_RELEASE=-O1 -g1"
        -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
        -DCMAKE_C_COMPILER_LAUNCHER=ccache -DDSASERVE_CUDA=OFF -DDSASERVE_BENCH=OFF)
t0=$SECONDS
stamp() { echo "sanitize.sh: $1 ($((SECONDS - t0)) s)"; }

# ---- ASan + UBSan ----
cmake -S . -B build-asan "${common[@]}" -DDSASERVE_FUZZ=ON -DDSASERVE_SANITIZE=address,undefined >/dev/null
fuzzers=(safetensors_fuzz tokenizer_fuzz chat_template_fuzz request_fuzz http_fuzz)
cmake --build build-asan -j"$(nproc)" --target core_test io_test server_test serve_e2e_test dsaserve \
  "${fuzzers[@]}"
stamp "ASan + UBSan build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in core/core_test io/io_test server/server_test server/serve_e2e_test; do
  "./build-asan/tests/$t" --gtest_brief=1
done
# (serve_grammar_test takes ~5 min under ASan on 2 cores: it runs in the plain ctest pass only; the fuzzers
# reach the grammar code.)
stamp "ASan + UBSan tests"
fuzz() {
  local name=$1 dir=$2
  shift 2
  mkdir -p "build-asan/fuzz-corpus/$name"
  local seeds=()
  [ -d "tests/fuzz/corpus/$name" ] && seeds=("tests/fuzz/corpus/$name")
  if ! "./build-asan/tests/$dir/$name" -max_total_time="$FUZZ_SECONDS" -seed="$FUZZ_SEED" -timeout=20 -rss_limit_mb=4096 "$@" \
       -artifact_prefix="build-asan/fuzz-corpus/$name-" "build-asan/fuzz-corpus/$name" "${seeds[@]}" \
       >"build-asan/$name.log" 2>&1; then
    tail -60 "build-asan/$name.log"
    echo "sanitize.sh: $name failed (log build-asan/$name.log, input build-asan/fuzz-corpus/$name-*)"
    return 1
  fi
  tail -1 "build-asan/$name.log"
}
fuzz safetensors_fuzz io -max_len=4096
fuzz tokenizer_fuzz fuzz -max_len=2048
fuzz chat_template_fuzz fuzz -max_len=4096
fuzz request_fuzz fuzz -max_len=4096
# The in-process server: its threads keep running, so no leak check at exit.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 fuzz http_fuzz fuzz -max_len=4096
stamp "fuzzing"

# ---- TSan ----
if [ "${SANITIZE_SKIP_TSAN:-0}" != 1 ]; then
  cmake -S . -B build-tsan "${common[@]}" -DDSASERVE_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j"$(nproc)" --target server_test serve_e2e_test dsaserve
  stamp "TSan build"
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  ./build-tsan/tests/server/server_test --gtest_brief=1
  ./build-tsan/tests/server/serve_e2e_test --gtest_brief=1
  stamp "TSan tests"
fi
