#!/usr/bin/env bash
# Packs the Boost headers the server needs (Beast/Asio are header-only) into .deps/boost-headers.tar.xz
# (~2 MB; .deps is ignored by git and carried to the GPU machine, whose image may have no Boost), with
# Debian's Boost CMake package files so that find_package(Boost) finds them under the unpack prefix.
# The header set: every top-level Boost library folder that a server object includes (read from a
# build folder's Ninja dependency lists; default build-cudaserve), whole, so that another compiler's
# configuration headers are there too.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cudaserve}
mkdir -p .deps
list=$(mktemp)
(cd "$build" && ninja -t deps) | grep -o '/usr/include/boost/[^ ]*' | sed 's|^/usr/include/||' |
  awk -F/ '{ if (NF > 2) print $1 "/" $2; else print $0 }' | sort -u > "$list"
[ -s "$list" ] || { echo "no Boost headers in $build's dependency lists: build the server there first" >&2; exit 1; }
# Top-level headers that the folders include without being named in the lists (version, config).
printf '%s\n' boost/version.hpp boost/config.hpp boost/config >> "$list"
arch=usr/lib/x86_64-linux-gnu/cmake
stage=$(mktemp -d)
mkdir -p "$stage/usr/include" "$stage/$arch"
(cd /usr/include && sort -u "$list" | xargs cp -r --parents -t "$stage/usr/include")
cp -r /$arch/Boost-1.74.0 /$arch/boost_headers-1.74.0 /$arch/BoostDetectToolset-1.74.0.cmake "$stage/$arch/"
tar -C "$stage" -cJf .deps/boost-headers.tar.xz usr
rm -rf "$stage" "$list"
ls -la .deps/boost-headers.tar.xz
