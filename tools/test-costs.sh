#!/usr/bin/env bash
# Refreshes tests/ctest-costs.txt, the test times .ci/run seeds a fresh build folder with (ctest
# then starts the longest tests first), from a build folder's last full `ctest` run:
#   tools/test-costs.sh build
# Times are only an order: any machine's will do, but run it after a whole suite, not a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: tools/test-costs.sh BUILD_DIR}/Testing/Temporary/CTestCostData.txt"
[ -s "$data" ] || { echo "no $data: run the suite in that folder first" >&2; exit 1; }
{
  awk 'NF == 3 && $3 > 0 { printf "%s 1 %.1f\n", $1, $3 }' "$data" | sort
  echo ---
} > tests/ctest-costs.txt
echo "tests/ctest-costs.txt: $(grep -c ' 1 ' tests/ctest-costs.txt) tests"
