#!/usr/bin/env bash
# Packs a git ref's tree into .deps/base-src.tgz (.deps is ignored by git and carried to the GPU machine) for
# scripts/gpu_ab.sh, which builds it beside the working tree and times both in one device call.
#   bash scripts/stage_base.sh [REF]   (default HEAD: the last commit, against the uncommitted working tree)
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-HEAD}
mkdir -p .deps
git archive --format=tar "$ref" | gzip -9 > .deps/base-src.tgz
echo "$(git rev-parse --short "$ref") -> .deps/base-src.tgz ($(du -h .deps/base-src.tgz | cut -f1))"
