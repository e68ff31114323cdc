#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite; non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh -DDSASERVE_WERROR=ON
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 1800
