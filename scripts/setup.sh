#!/usr/bin/env bash
# Installs everything dsaserve needs on a fresh Debian 12 machine (apt + pip), idempotent.
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) is expected at /usr/local/cuda when CUDA targets are wanted.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
pkgs=(
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev clang-format
  libboost-dev libboost-system-dev   # Boost.Beast / Asio: the HTTP server, the rendezvous store
  libgloo-dev                        # Gloo: CPU collectives between ranks (src/dist)
  nlohmann-json3-dev                 # JSON: configs, safetensors headers, the API
  libpcre2-dev                       # PCRE2 (JIT): tokenizer pre-tokenizer regexes
  libcli11-dev                       # CLI11: command line
  libspdlog-dev libfmt-dev           # logging and formatting
  libgtest-dev libgmock-dev          # GoogleTest
  libbenchmark-dev                   # Google Benchmark: bench/
  python3-pip curl
)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Python: reference libraries for property tests and benchmarks (HF tokenizers, Jinja2) and numpy.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements.txt"
bash "$(dirname "$0")/fetch_xgrammar.sh"   # xgrammar C++ source (grammar-constrained decoding), built by CMake
