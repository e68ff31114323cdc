#!/usr/bin/env bash
# Sourced by scripts/gpu.sh and scripts/gpu_serve_check.sh on the GPU machine (repository root as the
# working directory): unpacks the carried Debian packages (.deps/debs, scripts/fetch_gpu_deps.sh) and, when
# the machine has no Boost, the server's Boost headers (.deps/boost-headers.tar.xz, scripts/stage_boost.sh)
# into a prefix, then configures build-gpu against them and builds the given targets.
#   gpu_build LOGDIR TARGET...   logs: LOGDIR/device.txt, configure.log, build.log; returns non-zero on failure
PREFIX=/tmp/dsaserve-deps
ARCHLIB=$PREFIX/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$ARCHLIB:$PREFIX/usr/lib:${LD_LIBRARY_PATH:-}"  # Gloo installs to /usr/lib
export PATH="/usr/local/cuda/bin:$PATH"
export DSASERVE_FIXTURES="$PWD/.fixtures"

gpu_build() {
  local log=$1
  shift
  mkdir -p "$log" "$PREFIX"
  for f in .deps/debs/*.deb; do
    [ -f "$f" ] || continue  # none carried (scripts/gpu_ab.sh's base tree uses the prefix this tree filled)
    dpkg -x "$f" "$PREFIX" 2>/dev/null ||
      { mkdir -p /tmp/x && (cd /tmp/x && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$PREFIX"); }
  done
  local boost=()
  if [ ! -f /usr/include/boost/version.hpp ] && [ -f .deps/boost-headers.tar.xz ]; then
    tar -C "$PREFIX" -xJf .deps/boost-headers.tar.xz && boost=(-DBoost_DIR="$ARCHLIB/cmake/Boost-1.74.0")
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$log/device.txt"
  local start
  start=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSASERVE_BENCH=ON \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
    -DGTest_DIR="$ARCHLIB/cmake/GTest" -Dfmt_DIR="$ARCHLIB/cmake/fmt" -Dspdlog_DIR="$ARCHLIB/cmake/spdlog" \
    -DPCRE2_INCLUDE_DIR="$PREFIX/usr/include" -DPCRE2_LIBRARY="$ARCHLIB/libpcre2-8.so" \
    -DGLOO_INCLUDE_DIR="$PREFIX/usr/include" -DGLOO_LIBRARY="$PREFIX/usr/lib/libgloo.so" \
    -Dbenchmark_DIR="$ARCHLIB/cmake/benchmark" "${boost[@]}" >"$log/configure.log" 2>&1 ||
    { tail -40 "$log/configure.log"; return 1; }
  cmake --build build-gpu -j"$(nproc)" --target "$@" >"$log/build.log" 2>&1 ||
    { grep -E "error|Error" -A5 "$log/build.log" | head -60; return 1; }
  echo "build: $(( $(date +%s) - start )) s"
}
