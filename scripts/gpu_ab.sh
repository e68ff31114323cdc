#!/usr/bin/env bash
# An A/B on one GPU in one device call (timings only compare on the same card, so the baseline runs beside the
# change): builds TARGETS of the working tree (build-gpu) and of the base tree packed by scripts/stage_base.sh
# (.deps/base-src.tgz), the two builds at once, then runs COMMAND for each tree in turn, AB_REPEATS times
# (default 1), with BUILD set to that tree's build folder. Logs under $OUT (ab_new_R.txt, ab_base_R.txt); the
# lines matching AB_GREP (default "^ROW") are printed. Carry: [".deps", ".fixtures"].
#   bash scripts/gpu_ab.sh "realwidth_gpu_bench" \
#     '$BUILD/bench/realwidth_gpu_bench --prefill 4096 --batches 1 --contexts 4096 --verify-tokens 0'
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ $# -eq 2 ] || { echo "usage: gpu_ab.sh \"TARGET...\" 'COMMAND using \$BUILD'" >&2; exit 2; }
[ -f .deps/base-src.tgz ] || { echo "no .deps/base-src.tgz: run scripts/stage_base.sh [REF] first" >&2; exit 2; }
targets=$1
cmd=$2
OUT=${OUT:-/tmp/dsaserve-gpu-out}
BASE=/tmp/dsaserve-base
rm -rf "$BASE"
mkdir -p "$BASE/.deps/debs" "$OUT/base"
tar -xzf .deps/base-src.tgz -C "$BASE"
for d in .deps/xgrammar-*; do ln -s "$PWD/$d" "$BASE/.deps/"; done
ln -s "$PWD/.fixtures" "$BASE/.fixtures"
# The base tree builds against the prefix that this tree's gpu_build fills (Debian packages, Boost headers),
# once its configure step shows the prefix is complete; its own .deps/debs is empty (gpu_build skips it).
(
  while [ ! -f build-gpu/build.ninja ]; do sleep 2; done
  # shellcheck disable=SC1091,SC2086
  cd "$BASE" && source scripts/gpu_build.sh && gpu_build "$OUT/base" $targets
) > "$OUT/base_build.txt" 2>&1 &
base_pid=$!
# shellcheck disable=SC1091
source scripts/gpu_build.sh
# shellcheck disable=SC2086
if ! gpu_build "$OUT" $targets; then
  kill "$base_pid" 2>/dev/null
  exit 1
fi
if ! wait "$base_pid"; then
  echo "the base tree's build failed:"
  tail -20 "$OUT/base_build.txt"
  exit 1
fi
for r in $(seq "${AB_REPEATS:-1}"); do
  for side in new base; do
    build=$PWD/build-gpu
    [ "$side" = base ] && build=$BASE/build-gpu
    BUILD=$build bash -c "$cmd" > "$OUT/ab_${side}_$r.txt" 2>&1
    echo "== $side (run $r, rc $?)"
    grep -E "${AB_GREP:-^ROW}" "$OUT/ab_${side}_$r.txt"
  done
done
