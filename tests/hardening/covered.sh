#!/usr/bin/env bash
# What the hardening stages (`make test-hardening`: the whole suite under ASan + UBSan, the
# threaded suites under TSan, each fuzz target for a few seconds) covered, in two lines: one hash
# over every tracked file they build or read, and the kernel sets this CPU runs (the kernel tests
# check each set the machine has, so a stamp from a machine without AVX-512 does not cover it).
# `make test-hardening` writes this to tests/hardening/verified after the stages pass; `.ci/run`
# skips the stages when `covered.sh --check` finds the checkout as verified (the rule and why:
# docs/PERFORMANCE.md, "CI stages").
#
#   covered.sh           prints the two lines
#   covered.sh --check   exit 0 when the hash equals verified's and verified's kernel sets
#                        include this machine's; 1 otherwise (saying why)
set -euo pipefail
cd "$(dirname "$0")/../.."

covered_hash() {
  # Everything tracked but what no sanitizer stage builds or reads for its checks: prose, the
  # stamps themselves and ctest's cost hints (which only order the tests).
  git ls-files -z | grep -zvE '(^docs/|\.md$|^tests/package/verified$|^tests/hardening/verified$|^tests/ctest-costs\.txt$)' |
    sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}

kernel_sets() {
  local flags sets="scalar"
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
  if has avx2 fma f16c; then sets+=" avx2"; fi
  if has avx512f avx512bw avx512vl avx512dq fma f16c; then sets+=" avx512"; fi
  if [ "$(uname -m)" = aarch64 ] || [ "$(uname -m)" = arm64 ]; then sets+=" neon"; fi
  echo "$sets"
}

now="$(covered_hash)
kernel sets: $(kernel_sets)"
if [ "${1:-}" != --check ]; then
  echo "$now"
  exit 0
fi
stamp=tests/hardening/verified
if [ ! -s "$stamp" ]; then
  echo "hardening: no stamp ($stamp)"
  exit 1
fi
if [ "$(sed -n 1p "$stamp")" != "$(echo "$now" | sed -n 1p)" ]; then
  echo "hardening: the files the stages cover changed since they last passed"
  exit 1
fi
have=" $(sed -n 2p "$stamp" | sed 's/^kernel sets: //') "
for s in $(kernel_sets); do
  if [[ "$have" != *" $s "* ]]; then
    echo "hardening: the stamp's machine did not run the $s kernels, which this one has"
    exit 1
  fi
done
echo "hardening: the files the stages cover are as verified (kernel sets:$have)"
