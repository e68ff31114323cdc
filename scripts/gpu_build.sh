#!/usr/bin/env bash
# Sourced by scripts/gpu.sh and scripts/gpu_serve_check.sh on the GPU machine (repository root as the
# working directory): unpacks the carried Debian packages (.deps/debs, scripts/fetch_gpu_deps.sh; the prebuilt
# binaries' runtime ones in .prebuilt/debs, scripts/stage_prebuilt.sh) and, when
# the machine has no Boost, the server's Boost headers (.deps/boost-headers.tar.xz, scripts/stage_boost.sh)
# into a prefix, then configures build-gpu against them and builds the given targets.
#   gpu_build LOGDIR TARGET...   logs: LOGDIR/device.txt, configure.log, build.log; returns non-zero on failure
#   GPU_PREBUILT=1 gpu_build ...  the binaries staged by scripts/stage_prebuilt.sh instead, where they fit
PREFIX=/tmp/dsaserve-deps
ARCHLIB=$PREFIX/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$ARCHLIB:$PREFIX/usr/lib:${LD_LIBRARY_PATH:-}"  # Gloo installs to /usr/lib
export PATH="/usr/local/cuda/bin:$PATH"
export DSASERVE_FIXTURES="$PWD/.fixtures"

# The sources' fingerprint (the same command here, in scripts/stage_prebuilt.sh, and on the GPU machine): the
# prebuilt binaries are used only for the very sources they were built from.
source_fingerprint() {
  find src tests bench cmake configs CMakeLists.txt -type f \( -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o \
    -name '*.h' -o -name '*.hpp' -o -name '*.inc' -o -name '*.in' -o -name '*.json' -o -name 'CMakeLists.txt' -o \
    -name '*.cmake' \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
# The prebuilt binaries' RUNPATH is the build machine's toolkit folder: the GPU machine's toolkit libraries
# through the environment instead (exported here, at the top, so that callers running gpu_build in a pipeline's
# subshell have it too).
if [ "${GPU_PREBUILT:-0}" = 1 ]; then
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:$LD_LIBRARY_PATH"
fi

# GPU_PREBUILT=1: the targets from .prebuilt/ (scripts/stage_prebuilt.sh, carried) into build-gpu/ at their
# build-tree paths, when .prebuilt/FINGERPRINT matches these sources and every binary finds its libraries:
# no build on the GPU machine (~100 s of device time). Not for scripts that need build-gpu's CMake files
# (gpu.sh runs ctest; gpu_ab.sh builds a base tree beside it). Returns non-zero (nothing used) otherwise.
use_prebuilt() {
  local log=$1
  shift
  local want have t f
  [ -f .prebuilt/FINGERPRINT ] || { echo "prebuilt: no .prebuilt/FINGERPRINT" | tee "$log/prebuilt.txt"; return 1; }
  want=$(cat .prebuilt/FINGERPRINT)
  have=$(source_fingerprint)
  [ "$want" = "$have" ] || { echo "prebuilt: built from $want, the sources are $have" | tee "$log/prebuilt.txt"; return 1; }
  local libs
  for t in "$@"; do
    f=$(cd .prebuilt && find . -type f -name "$t" | head -1)
    [ -n "$f" ] || { echo "prebuilt: no $t" | tee "$log/prebuilt.txt"; return 1; }
    { mkdir -p "build-gpu/$(dirname "$f")" && cp ".prebuilt/$f" "build-gpu/$f" && chmod +x "build-gpu/$f"; } ||
      { echo "prebuilt: could not place $t" | tee "$log/prebuilt.txt"; return 1; }
    libs=$(ldd "build-gpu/$f" 2>&1 || true)
    case $libs in
      *"not found"* | *"not a dynamic executable"*)
        { echo "prebuilt: $t misses libraries:"; echo "$libs"; } | tee "$log/prebuilt.txt"
        return 1
        ;;
    esac
  done
  echo "build: 0 s (prebuilt $want: $*)"
}

gpu_build() {
  local log=$1
  shift
  mkdir -p "$log" "$PREFIX"
  for f in .deps/debs/*.deb .prebuilt/debs/*.deb; do
    [ -f "$f" ] || continue  # none carried (scripts/gpu_ab.sh's base tree uses the prefix this tree filled)
    dpkg -x "$f" "$PREFIX" 2>/dev/null ||
      { mkdir -p /tmp/x && (cd /tmp/x && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$PREFIX"); }
  done
  local boost=()
  if [ ! -f /usr/include/boost/version.hpp ] && [ -f .deps/boost-headers.tar.xz ]; then
    tar -C "$PREFIX" -xJf .deps/boost-headers.tar.xz && boost=(-DBoost_DIR="$ARCHLIB/cmake/Boost-1.74.0")
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$log/device.txt"
  if [ "${GPU_PREBUILT:-0}" = 1 ]; then
    use_prebuilt "$log" "$@" && return 0
    echo "prebuilt: not used; building"
  fi
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
