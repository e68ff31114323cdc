#!/usr/bin/env bash
# The clang-format check (the repo's .clang-format) over every tracked C++/CUDA source under src/, tests/ and
# bench/: lists the files clang-format would change and exits non-zero when there is any. `--fix` rewrites
# them instead. Part of scripts/test.sh (so CI runs it). The whole tree is formatted, so the check covers it
# all (no baseline list to keep in sync between branches); each branch formats the files it touches.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format_check: clang-format not found (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files -- 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.cpp' 'tests/*.h' \
  'tests/*.cu' 'tests/*.cuh' 'bench/*.cpp' 'bench/*.h' 'bench/*.cu' 'bench/*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format_check: ${#bad[@]} file(s) differ from .clang-format ($(clang-format --version)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run: bash scripts/format_check.sh --fix" >&2
  exit 1
fi
echo "format_check: ${#files[@]} files formatted"
