#!/usr/bin/env bash
# The test suite: the clang-format check (scripts/format_check.sh), then builds with warnings as errors (C++
# and CUDA) and runs every test (ctest), then the sanitizer and fuzz pass over the input parsers
# (scripts/sanitize.sh) and the tokenizer and chat tests under the same sanitizers (scripts/sanitize_text.sh).
# Non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/format_check.sh
bash scripts/build.sh -DDSASERVE_WERROR=ON
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 1800)
bash scripts/sanitize.sh
bash scripts/sanitize_text.sh
