#!/bin/sh
# CI's format check: every C++ file of the repository follows .clang-format (clang-format 14, as
# Debian 12 ships it). Exit 77 (CTest: skipped) when clang-format is not installed.
cd "$(dirname "$0")/.." || exit 1
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not found: skipped"; exit 77; }
if command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files '*.cpp' '*.h')
else
  files=$(find src tests bench include -name '*.cpp' -o -name '*.h' 2>/dev/null)
fi
# shellcheck disable=SC2086
clang-format --dry-run -Werror $files
