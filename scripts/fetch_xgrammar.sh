#!/usr/bin/env bash
# Downloads xgrammar's source (PyPI sdist, C++ core only is used) into .deps/xgrammar-<version> (ignored by
# git) and checks its sha256; idempotent. CMake builds its C++ library from there (cmake/xgrammar.cmake):
# the grammar module (tool_choice / response_format constrained decoding) links it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
URL=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${VERSION}.tar.gz
DEST=.deps/xgrammar-${VERSION}
if [ -f "$DEST/.complete" ]; then exit 0; fi
mkdir -p .deps
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/xgrammar.tar.gz" "$URL"
echo "$SHA256  $tmp/xgrammar.tar.gz" | sha256sum -c --quiet -
tar -xzf "$tmp/xgrammar.tar.gz" -C "$tmp"
rm -rf "$DEST"
mkdir -p "$DEST/3rdparty"
# Only what the C++ library needs (keeps .deps small enough to carry to the GPU machine).
src="$tmp/xgrammar-${VERSION}"
cp -r "$src/cpp" "$src/include" "$src/LICENSE" "$src/NOTICE" "$DEST/"
cp -r "$src/3rdparty/picojson" "$src/3rdparty/dlpack" "$DEST/3rdparty/"
rm -rf "$DEST/cpp/tvm_ffi"
touch "$DEST/.complete"
echo "xgrammar ${VERSION} -> $DEST"
