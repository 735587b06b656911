#!/usr/bin/env bash
# Runs libFuzzer programs (fuzz/, built by `make fuzz` into BUILD) one after the other, each for
# SECONDS, on a corpus kept in BUILD/fuzz-corpus/TARGET and seeded from tests/data/fuzz/TARGET
# (the inputs the test suite replays). A crash, hang, leak or sanitizer report stops that target
# and fails the run; the input is left in BUILD/fuzz-artifacts/TARGET/. Keep it as a regression
# input: copy it to tests/data/fuzz/TARGET/crash-NAME and fix the bug (FuzzRegression replays it).
#
#   tools/fuzz.sh BUILD SECONDS TARGET...
# Extra libFuzzer flags may come in FUZZ_FLAGS (e.g. FUZZ_FLAGS="-jobs=2 -workers=2").
set -u
build=$1 seconds=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
failed=()
for t in "$@"; do
  bin="$build/fuzz/fuzz_$t"
  corpus="$build/fuzz-corpus/$t"
  artifacts="$build/fuzz-artifacts/$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz.sh: $bin is not built (make fuzz builds it)" >&2
    exit 2
  fi
  mkdir -p "$corpus" "$artifacts"
  echo "== fuzz_$t for ${seconds}s (corpus $corpus)"
  # -timeout: one input may take at most 30 s (the http target waits up to 10 s for a reply);
  # -rss_limit_mb: a parser that allocates what a file claims instead of checking it fails here.
  # shellcheck disable=SC2086
  if ! "$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=3072 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" ${FUZZ_FLAGS:-} "$corpus" "$root/tests/data/fuzz/$t" \
      > "$build/fuzz-$t.log" 2>&1; then
    tail -n 60 "$build/fuzz-$t.log"
    echo "fuzz_$t FAILED: the input is in $artifacts/ (log: $build/fuzz-$t.log)" >&2
    failed+=("$t")
  else
    grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units)" "$build/fuzz-$t.log" | tail -n 2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no findings in $*"
