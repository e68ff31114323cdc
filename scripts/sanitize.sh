#!/usr/bin/env bash
# Builds the input-parsing modules with clang + AddressSanitizer + UndefinedBehaviorSanitizer, runs their
# tests, and fuzzes the safetensors reader with libFuzzer for a fixed time (FUZZ_SECONDS, default 30).
# Part of scripts/test.sh (so CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DDSASERVE_CUDA=OFF -DDSASERVE_BENCH=OFF -DDSASERVE_FUZZ=ON -DDSASERVE_SANITIZE=address,undefined >/dev/null
targets=(core_test io_test safetensors_fuzz)
cmake --build build-asan -j"$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
./build-asan/tests/core/core_test --gtest_brief=1
./build-asan/tests/io/io_test --gtest_brief=1
mkdir -p build-asan/fuzz-corpus
./build-asan/tests/io/safetensors_fuzz -max_total_time="${FUZZ_SECONDS:-30}" -max_len=4096 build-asan/fuzz-corpus 2>&1 | tail -3
