#!/usr/bin/env bash
# Copies the fixtures a GPU run needs into .fixtures/ (ignored by git) so a device call can carry them
# (../shared does not travel). Default: the three models and the tokenizer (~57 MB; the carry limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${DSASERVE_FIXTURES:-../shared/fixtures}
mkdir -p .fixtures/models
for m in ${@:-tiny realdims realdims_fp8}; do cp -r "$src/models/$m" .fixtures/models/; done
mkdir -p .fixtures/configs && cp "$src"/configs/*.json .fixtures/configs/
du -sh .fixtures
