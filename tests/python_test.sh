#!/usr/bin/env bash
# CTest driver of the pytest suite (python/tests): installs the package the documented way
# (python/install.sh) into a fresh virtual environment in a temporary folder, from a copy of
# python/ there (pip builds in the source folder, and tests write only into their temporary
# folder), then runs pytest against the built `deltafin` binary. Exit 77 = skipped (no
# python3-venv, numpy or pytest).
#   usage: tests/python_test.sh SOURCE_ROOT LIBDELTAFIN_SO DELTAFIN_BINARY TMP_PARENT
set -euo pipefail
root=$1 lib=$2 bin=$3 parent=$4
mkdir -p "$parent"
tmp=$(realpath "$(mktemp -d "$parent/pytest.XXXXXX")")
lib=$(realpath "$lib") bin=$(realpath "$bin")
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/python" "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info "$tmp/src/deltafin/libdeltafin.so"
rc=0
bash "$root/python/install.sh" "$tmp/venv" "$lib" "$tmp/src" || rc=$?
if [ $rc -ne 0 ]; then exit $rc; fi
if ! "$tmp/venv/bin/python" -c 'import pytest' 2>/dev/null; then
  echo "pytest is missing (install python3-pytest): skipping" >&2; exit 77
fi
cd "$tmp"  # import the installed package, not the source folder
DELTAFIN_BINARY=$bin DELTAFIN_CACHE="$tmp/cache" "$tmp/venv/bin/python" -m pytest -q \
  -p no:cacheprovider --basetemp="$tmp/pytest" "$tmp/src/tests"
