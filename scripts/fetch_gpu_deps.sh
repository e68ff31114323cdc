#!/usr/bin/env bash
# Downloads the Debian packages the GPU build needs into .deps/debs (ignored by git), so that a device
# call can carry them: the GPU machine has the CUDA toolkit and CMake but none of Debian's -dev packages.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download -q libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev \
  libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0 libbenchmark-dev libbenchmark1debian \
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 2>&1 | grep -v '^W:' || true
ls -la
