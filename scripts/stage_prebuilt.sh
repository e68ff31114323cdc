#!/usr/bin/env bash
# Builds GPU targets here (the CUDA toolkit compiles and links on this machine; nothing runs) and stages the
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
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target "${targets[@]}"
rm -rf .prebuilt
for t in "${targets[@]}"; do
  f=$(cd build && find . -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "stage_prebuilt: no binary for $t under build/" >&2; exit 1; }
  mkdir -p ".prebuilt/$(dirname "$f")"
  cp "build/$f" ".prebuilt/$f"
  strip ".prebuilt/$f"
done
source_fingerprint > .prebuilt/FINGERPRINT
echo "$(cat .prebuilt/FINGERPRINT) -> .prebuilt ($(du -sh .prebuilt | cut -f1)): ${targets[*]}"
