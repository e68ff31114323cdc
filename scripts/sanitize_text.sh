#!/usr/bin/env bash
# The tokenizer's and the chat module's (Jinja templates, tool-call and reasoning parsers) tests under
# AddressSanitizer + UndefinedBehaviorSanitizer, in the clang build scripts/sanitize.sh configures
# (build-asan, CPU only). Run after it by scripts/test.sh (so CI runs it). Non-zero exit on any failure or
# sanitizer report (the build aborts on the first UB: -fno-sanitize-recover=all).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build-asan/CMakeCache.txt ]] || bash scripts/sanitize.sh
cmake --build build-asan -j"$(nproc)" --target tokenizer_test chat_test
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# (Cli.*: the tokenize / detokenize subcommands through the dsaserve binary, which this pass does not
# build; the plain build's ctest runs them.)
./build-asan/tests/tokenizer/tokenizer_test --gtest_brief=1 --gtest_filter=-Cli.*
./build-asan/tests/chat/chat_test --gtest_brief=1
