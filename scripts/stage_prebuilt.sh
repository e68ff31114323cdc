#!/usr/bin/env bash
# Builds GPU targets here in build-prebuilt/ (the CUDA toolkit compiles and links on this machine; nothing runs) and stages the
# stripped binaries into .prebuilt/ (ignored by git) at their build-tree paths, with the sources' fingerprint,
# so that a device call carrying .prebuilt (beside .deps: its Debian packages give the shared libraries) and
# run with GPU_PREBUILT=1 skips the ~100 s build (scripts/gpu_build.sh use_prebuilt; it builds as before when
# the sources differ from the fingerprint or a binary misses a library there).
#   bash scripts/stage_prebuilt.sh [TARGET...]   (default: cuda_kernels_test realwidth_gpu_bench ops_gpu_bench)
#   then e.g. GPU_PREBUILT=1 bash scripts/gpu_decode_levers.sh, carry [".deps", ".fixtures", ".prebuilt"]
#   (the carry limit is 64 MiB: scripts/stage_fixtures.sh tiny realdims_fp8 leaves room for three binaries)
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
echo "$fp" > .prebuilt/FINGERPRINT
echo "$(cat .prebuilt/FINGERPRINT) -> .prebuilt ($(du -sh .prebuilt | cut -f1)): ${targets[*]}"
