#!/usr/bin/env bash
# The one GPU script: run on the GPU machine through the device tool, from the repository root, with
#   carry: [".deps", ".fixtures"]   (scripts/fetch_gpu_deps.sh and scripts/stage_fixtures.sh make them)
# It unpacks the carried Debian packages into a prefix, builds the CUDA targets (sm_90a), runs every GPU
# test (and the GPU benchmarks when they exist), writes full logs under $OUT and prints a short table last.
# Usage: bash scripts/gpu.sh [ctest regex, default: the CUDA tests]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dsaserve-gpu-out}
mkdir -p "$OUT"
PREFIX=/tmp/dsaserve-deps
mkdir -p "$PREFIX"
for f in .deps/debs/*.deb; do dpkg -x "$f" "$PREFIX" 2>/dev/null || { mkdir -p /tmp/x && (cd /tmp/x && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$PREFIX"); }; done
ARCHLIB=$PREFIX/usr/lib/x86_64-linux-gnu
# Boost headers for the server (scripts/stage_boost.sh), unless the machine has its own.
BOOST_ARGS=()
if [ ! -f /usr/include/boost/version.hpp ] && [ -f .deps/boost-headers.tar.xz ]; then
  tar -C "$PREFIX" -xJf .deps/boost-headers.tar.xz && BOOST_ARGS=(-DBoost_DIR="$ARCHLIB/cmake/Boost-1.74.0")
fi
export LD_LIBRARY_PATH="$ARCHLIB:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSASERVE_BENCH=ON \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
  -DGTest_DIR="$ARCHLIB/cmake/GTest" -Dfmt_DIR="$ARCHLIB/cmake/fmt" -Dspdlog_DIR="$ARCHLIB/cmake/spdlog" \
  -DPCRE2_INCLUDE_DIR="$PREFIX/usr/include" -DPCRE2_LIBRARY="$ARCHLIB/libpcre2-8.so" \
  -Dbenchmark_DIR="$ARCHLIB/cmake/benchmark" "${BOOST_ARGS[@]}" >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
# Targets: $GPU_TARGETS (default: the CUDA test binary), so work in progress elsewhere does not block.
cmake --build build-gpu -j"$(nproc)" --target ${GPU_TARGETS:-cuda_kernels_test} >"$OUT/build.log" 2>&1 || { grep -E "error|Error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export DSASERVE_FIXTURES="$PWD/.fixtures"
regex=${1:-Cuda}
(cd build-gpu && ctest -R "$regex" --output-on-failure --timeout 600 -j1 ) >"$OUT/ctest.log" 2>&1
rc=$?
# Per-test measured numbers: every GPU test prints lines starting with "RESULT " (op, error, timing).
grep -h "^RESULT " "$OUT/ctest.log" build-gpu/Testing/Temporary/LastTest.log 2>/dev/null | sort -u > "$OUT/results.txt"
for b in build-gpu/bench/*_gpu_bench; do [ -x "$b" ] && "$b" | tee -a "$OUT/bench.txt"; done
echo "=== GPU tests ($regex): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "Passed|Failed|Skipped|\*\*\*" "$OUT/ctest.log" | sed 's/^ *//' | head -80
[ -s "$OUT/results.txt" ] && { echo "=== results"; cat "$OUT/results.txt"; }
exit $rc
