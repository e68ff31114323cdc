#!/usr/bin/env bash
# The test suite: the clang-format check (scripts/format_check.sh), then builds with warnings as errors (C++
# and CUDA) and runs every test (ctest; on a failure scripts/ctest_digest.py prints why, last), then the
# sanitizer and fuzz pass over the input parsers (scripts/sanitize.sh) and the tokenizer and chat tests under
# the same sanitizers (scripts/sanitize_text.sh).
# Non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/format_check.sh
bash scripts/build.sh -DDSASERVE_WERROR=ON
if ! (cd build && ctest --output-on-failure -j"$(nproc)" --timeout 1800); then
  python3 scripts/ctest_digest.py build  # why each failed test failed, last (CI keeps the tail)
  exit 1
fi
bash scripts/sanitize.sh
bash scripts/sanitize_text.sh
