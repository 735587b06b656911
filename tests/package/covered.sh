#!/usr/bin/env bash
# One hash over the files the package test (package_test.sh) covers: what builds the image and
# the Debian package, and what they install. `make test-package` writes it to
# tests/package/verified after a passing run; `.ci/run` runs the package test only when the hash
# of the checkout differs from that file (the rule and why: tests/package/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
paths=(Dockerfile .dockerignore compose.yaml packaging cmake/package.cmake tests/package/package_test.sh
  tests/package/covered.sh python/deltafin src/capi/CMakeLists.txt src/capi/deltafin.pc.in
  src/cli/CMakeLists.txt CMakeLists.txt Makefile)
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z -- "${paths[@]}" | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
else
  find "${paths[@]}" -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum |
    sha256sum | cut -d' ' -f1
fi
