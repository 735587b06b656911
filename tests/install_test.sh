#!/usr/bin/env bash
# `cmake --install` gives a usable C library: header, libdeltafin.so.1 and deltafin.pc in a
# temporary prefix; a C program built with `pkg-config --cflags --libs deltafin` and nothing
# else runs against it.
#   usage: tests/install_test.sh BUILD_DIR SOURCE_ROOT MODEL_DIR TMP_PARENT
set -euo pipefail
build=$1 root=$2 model=$3 parent=$4
mkdir -p "$parent"
tmp=$(realpath "$(mktemp -d "$parent/install.XXXXXX")")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component Unspecified >/dev/null
pc=$(find "$tmp/prefix" -name deltafin.pc)
test -n "$pc" || { echo "deltafin.pc was not installed" >&2; exit 1; }
test -f "$tmp/prefix/include/deltafin/deltafin.h"
export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/capi_c" "$root/tests/capi_c_test.c" \
  $(pkg-config --cflags --libs deltafin)
LD_LIBRARY_PATH=$(pkg-config --variable=libdir deltafin) "$tmp/capi_c" "$model" >/dev/null
echo "installed and linked through pkg-config: ok"
