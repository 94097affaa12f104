#!/usr/bin/env bash
# `cmake --install` of the library component into a temporary prefix, then the example in
# examples/c_api built against it twice: with find_package(shardpoint) and with pkg-config.
# Both programs run (save, partial load). Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$BUILD" --component library --prefix "$prefix" >/dev/null
test -f "$prefix/include/shardpoint/c_api.h"
test -f "$prefix/lib/cmake/shardpoint/shardpointConfig.cmake"
libdir=$(dirname "$(find "$prefix" -name 'libshardpoint.so' | head -1)")

echo "== find_package(shardpoint)"
cmake -S "$SRC/examples/c_api" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/c_api_example" "$work/ckpt1"

echo "== pkg-config shardpoint"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -o "$work/pc_example" "$SRC/examples/c_api/main.c" $(pkg-config --cflags --libs shardpoint)
LD_LIBRARY_PATH="$libdir" "$work/pc_example" "$work/ckpt2"
echo "install_test: OK"
