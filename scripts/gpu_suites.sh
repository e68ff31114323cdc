#!/usr/bin/env bash
# The GPU test binary run suite by suite: one process a suite (CUDA's start-up paid once a suite, not once a
# test as under ctest), each under its own time limit, all within a total budget that fits one device call.
# A hang shows as the one suite that ran out of its time, not as a call that ran out of time somewhere. A suite
# that passed leaves a marker under build-gpu/.suites_done, so a second call on the warm machine goes on where
# the first stopped. Prints one line a suite, then the failed tests; the gtest output of every suite goes to
# one log ($OUT/suites.log: few files under $OUT come back from the device).
# Run from the repository root through the device tool with carry [".deps", ".fixtures"]:
#   bash scripts/gpu_suites.sh [SUITES]   SUITES: a gtest filter of suite names (default all, e.g. 'CudaMoe:Cuda*Graph*')
#   env: SUITE_S (seconds a suite, default 150), TOTAL_S (seconds in all from the start, the build included, default 540)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/dsaserve-gpu-out}
mkdir -p "$OUT"
start=$(date +%s)
# shellcheck disable=SC1091
source scripts/gpu_build.sh
gpu_build "$OUT" cuda_kernels_test || exit 1
bin=build-gpu/tests/kernels/cuda/cuda_kernels_test
done_dir=build-gpu/.suites_done
mkdir -p "$done_dir"
log=$OUT/suites.log
: >"$log"
filter=${1:-*}
mapfile -t suites < <("$bin" --gtest_list_tests --gtest_filter="${filter//:/.*:}.*" | grep -E '^[A-Za-z0-9_/]+\.( |$)' | sed -E 's/\.( .*)?$//')
rc=0
not_run=()
failed=()
for s in "${suites[@]}"; do
  key=${s//\//_}
  if [ -f "$done_dir/$key" ]; then
    echo "$s: passed in an earlier call"
    continue
  fi
  remaining=$((${TOTAL_S:-540} - ($(date +%s) - start)))
  if [ "$remaining" -lt 20 ]; then
    not_run+=("$s")
    continue
  fi
  limit=$((${SUITE_S:-150} < remaining ? ${SUITE_S:-150} : remaining))
  t0=$(date +%s)
  timeout "$limit" "$bin" --gtest_filter="$s.*" --gtest_brief=1 >"$OUT/suite.txt" 2>&1
  r=$?
  { echo "=== $s (rc $r)"; cat "$OUT/suite.txt"; } >>"$log"
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$OUT/suite.txt" | grep -oE '[0-9]+$' || true)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$OUT/suite.txt" | grep -oE '[0-9]+' || true)
  case $r in
    0) verdict="passed ${passed:-0}${skipped:+, skipped $skipped}"; touch "$done_dir/$key" ;;
    124) verdict="OUT OF TIME after $limit s (a hang or a slow suite: the log has how far it got)"; rc=1 ;;
    *) verdict="FAILED (rc $r)"; rc=1 ;;
  esac
  printf '%-48s %4d s  %s\n' "$s" $(($(date +%s) - t0)) "$verdict"
  while IFS= read -r line; do failed+=("$line"); done < <(grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/suite.txt" | sed -E 's/ \([0-9]+ ms\)$//' | sort -u)
done
rm -f "$OUT/suite.txt"
[ ${#failed[@]} -gt 0 ] && printf '%s\n' "failed tests:" "${failed[@]}"
if [ ${#not_run[@]} -gt 0 ]; then
  echo "not run (TOTAL_S spent; call again on the warm machine to go on): ${not_run[*]}"
  rc=1
fi
echo "total $(($(date +%s) - start)) s"
exit $rc
