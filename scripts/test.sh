#!/usr/bin/env bash
# The test suite: builds with warnings as errors and runs every test (ctest), then the sanitizer and
# fuzz pass over the input parsers (scripts/sanitize.sh). Non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh -DDSASERVE_WERROR=ON
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 1800)
bash scripts/sanitize.sh
