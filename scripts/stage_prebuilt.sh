#!/usr/bin/env bash
# Builds GPU targets here in build-prebuilt/ (the CUDA toolkit compiles and links on this machine; nothing runs) and stages the
# stripped binaries into .prebuilt/ (ignored by git) at their build-tree paths, with the sources' fingerprint,
# and the Debian packages of the shared libraries they load that a GPU machine lacks (.prebuilt/debs: those
# of .deps/debs whose libraries the binaries link, today libfmt9 alone; gpu_build unpacks them), so that a
# device call carrying .prebuilt and run with GPU_PREBUILT=1 skips the ~100 s build (scripts/gpu_build.sh
# use_prebuilt; it builds as before when the sources differ from the fingerprint or a binary misses a library
# there) and needs no .deps (its -dev packages and xgrammar's source only serve a build).
#   bash scripts/stage_prebuilt.sh [TARGET...]   (default: cuda_kernels_test realwidth_gpu_bench ops_gpu_bench)
#   then e.g. GPU_PREBUILT=1 bash scripts/gpu_decode_levers.sh, carry [".fixtures", ".prebuilt"]
#   (the limit of a call's tree and carry is 64 MiB, the tracked tree ~4 of it: all three fixture models fit
#   with cuda_kernels_test alone, `scripts/stage_fixtures.sh tiny realdims_fp8` with the three binaries; the
#   total is printed last)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/gpu_build.sh
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(cuda_kernels_test realwidth_gpu_bench ops_gpu_bench)
export PATH="/usr/local/cuda/bin:$PATH"
# A build folder of its own with the GPU machine's options (gpu_build's), not build/'s cache (sanitizers...).
dir=build-prebuilt
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache); fi
fp=$(source_fingerprint)  # before the build: a source edited during it must not be staged as built
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSASERVE_BENCH=ON -DDSASERVE_TESTS=ON "${launcher[@]}" \
  >/dev/null
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
[ "$(source_fingerprint)" = "$fp" ] || { echo "stage_prebuilt: sources changed during the build; run again" >&2; exit 1; }
rm -rf .prebuilt
for t in "${targets[@]}"; do
  f=$(cd "$dir" && find . -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "stage_prebuilt: no binary for $t under $dir/" >&2; exit 1; }
  mkdir -p ".prebuilt/$(dirname "$f")"
  cp "$dir/$f" ".prebuilt/$f"
  strip ".prebuilt/$f"
done
# The packages of the libraries the binaries load, less the toolkit's and the C / C++ runtimes every machine has.
mkdir -p .prebuilt/debs
for pkg in $(find .prebuilt -type f -perm -u+x -exec ldd {} \; | awk '/=> \// {print $3}' | sort -u |
  grep -v '^/usr/local/cuda' | xargs -r -n1 readlink -f | xargs -r dpkg -S 2>/dev/null | cut -d: -f1 | sort -u); do
  case $pkg in libc6 | libstdc++6 | libgcc-s1) continue ;; esac
  deb=$(find .deps/debs -maxdepth 1 -name "${pkg}_*.deb" 2>/dev/null | head -1)
  [ -n "$deb" ] || { echo "stage_prebuilt: no .deps/debs/${pkg}_*.deb (scripts/fetch_gpu_deps.sh)" >&2; exit 1; }
  cp "$deb" .prebuilt/debs/
done
echo "$fp" > .prebuilt/FINGERPRINT
echo "$(cat .prebuilt/FINGERPRINT) -> .prebuilt ($(du -sh .prebuilt | cut -f1)): ${targets[*]}; debs: $(find .prebuilt/debs -name '*.deb' -printf '%f ')"
if [ -d .fixtures ]; then
  bytes=$(( $(du -scb .fixtures .prebuilt | tail -1 | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
  echo "tracked tree + carry [\".fixtures\", \".prebuilt\"]: $((bytes / 1048576)) MiB of the 64 a call may send"
fi
exit 0
