#!/usr/bin/env bash
# `cmake --install` of the library component into a temporary prefix, then the examples
# built against it as projects outside the tree would: examples/c_api (C) and
# examples/cpp_api (C++ API), each with find_package(shardpoint) and with pkg-config. Every
# program runs (save, partial load; the C++ one also CheckpointReader, verify, an error).
# The installed headers must need nothing but themselves and the standard library.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
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

echo "== exported symbols: the C API (sp_*) and namespace shardpoint, nothing else"
nm -DC --defined-only "$libdir/libshardpoint.so" | cut -d' ' -f3- >"$work/exports.txt"
grep -q '^sp_save' "$work/exports.txt"
grep -q '^shardpoint::engine::save(' "$work/exports.txt"
if grep -v -E '^(sp_|shardpoint::|(typeinfo|typeinfo name|vtable|VTT) for shardpoint::|(non-)?virtual thunk to shardpoint::)' \
    "$work/exports.txt"; then
  echo "install_test: libshardpoint.so exports the symbols above, outside its two APIs" >&2
  exit 1
fi

echo "== find_package(shardpoint)"
cmake -S "$SRC/examples/c_api" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/c_api_example" "$work/ckpt1"

echo "== pkg-config shardpoint"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -o "$work/pc_example" "$SRC/examples/c_api/main.c" $(pkg-config --cflags --libs shardpoint)
LD_LIBRARY_PATH="$libdir" "$work/pc_example" "$work/ckpt2"

echo "== public headers: only <shardpoint/...> and the standard library"
inc="$prefix/include/shardpoint"
test -f "$inc/checkpoint.h"
if grep -n '#include "' "$inc"/*.h | grep -v '#include "shardpoint/'; then
  echo "install_test: an installed header includes a header that is not installed" >&2
  exit 1
fi
for h in "$inc"/*.h; do echo "#include <shardpoint/$(basename "$h")>"; done >"$work/all_headers.cc"
c++ -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ "$work/all_headers.cc"

echo "== C++: find_package(shardpoint)"
cmake -S "$SRC/examples/cpp_api" -B "$work/build-cpp" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build-cpp" >/dev/null
"$work/build-cpp/cpp_api_example" "$work/ckpt3"

echo "== C++: pkg-config shardpoint"
c++ -std=c++20 -o "$work/pc_cpp_example" "$SRC/examples/cpp_api/main.cc" $(pkg-config --cflags --libs shardpoint)
LD_LIBRARY_PATH="$libdir" "$work/pc_cpp_example" "$work/ckpt4"
echo "install_test: OK"
