#!/usr/bin/env bash
# Cross-builds the kernel tests for AArch64 and runs them under user-mode QEMU, so the NEON table
# is tested on an x86 machine. The whole library needs aarch64 builds of every dependency, which
# a plain x86 box lacks, so this builds only what the kernels need: tensor/, kernels/ (scalar,
# dispatch, arm/neon), core/sysinfo + thread_pool (+ file_io, weight_buffer, which sysinfo's
# probes use), tests/kernels_test.cpp and kernels_quant_test.cpp, and GoogleTest from its
# Debian source package (fmt is used header-only). Everything is linked statically.
#
# Needs (Debian/Ubuntu): g++-aarch64-linux-gnu qemu-user libgtest-dev libfmt-dev
#   sudo apt-get install -y g++-aarch64-linux-gnu qemu-user libgtest-dev libfmt-dev
# Usage: tools/test-neon.sh [gtest args...]     (default: --gtest_filter='Kernels*')
# Environment: CXX_AARCH64 (default aarch64-linux-gnu-g++), OUT (default build-neon), JOBS.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cxx="${CXX_AARCH64:-aarch64-linux-gnu-g++}"
out="${OUT:-$root/build-neon}"
jobs="${JOBS:-2}"
gtest_src="${GTEST_SRC:-/usr/src/googletest/googletest}"
sysroot="${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}"

command -v "$cxx" >/dev/null || { echo "missing $cxx (apt-get install g++-aarch64-linux-gnu)" >&2; exit 2; }
command -v qemu-aarch64 >/dev/null || { echo "missing qemu-aarch64 (apt-get install qemu-user)" >&2; exit 2; }
[ -f "$gtest_src/src/gtest-all.cc" ] || { echo "missing $gtest_src (apt-get install libgtest-dev)" >&2; exit 2; }
[ -d /usr/include/fmt ] || { echo "missing /usr/include/fmt (apt-get install libfmt-dev)" >&2; exit 2; }

mkdir -p "$out/obj" "$out/include"
# Only the architecture-independent headers of the host: fmt and gtest (not /usr/include itself).
ln -sfn /usr/include/fmt "$out/include/fmt"
ln -sfn "$gtest_src/include/gtest" "$out/include/gtest"

flags=(-std=c++20 -O2 -Wall -Wextra -Wpedantic -Wno-missing-field-initializers -Werror
       -DDELTAFIN_HAVE_NEON=1 -DDELTAFIN_VERSION=\"neon-test\" -DFMT_HEADER_ONLY
       -DDELTAFIN_TEST_DATA=\"$root/tests/data\" -DDELTAFIN_BINARY=\"/nonexistent\"
       -DDELTAFIN_TEST_TMP=\"$out/tmp\"
       -I"$root/src" -I"$root/include" -isystem "$out/include")
gflags=(-std=c++20 -O2 -isystem "$out/include" -I"$gtest_src" -I"$gtest_src/include")

sources=(
  "$root/src/tensor/dtype.cpp" "$root/src/tensor/matrix.cpp"
  "$root/src/kernels/scalar.cpp" "$root/src/kernels/dispatch.cpp" "$root/src/kernels/arm/neon.cpp"
  "$root/src/core/sysinfo.cpp" "$root/src/core/thread_pool.cpp"
  "$root/src/core/file_io.cpp" "$root/src/core/weight_buffer.cpp"
  "$root/tests/kernels_test.cpp" "$root/tests/kernels_quant_test.cpp"
)

objs=()
pids=()
compile() {  # src obj flags...
  local src="$1" obj="$2"
  shift 2
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find "$root/src" "$root/tests" -name '*.h' -newer "$obj" -print -quit)" ]; then
    echo "  CXX $(basename "$src")"
    "$cxx" "$@" -c "$src" -o "$obj"
  fi
}
for s in "${sources[@]}"; do
  o="$out/obj/$(basename "${s%.*}").o"
  objs+=("$o")
  compile "$s" "$o" "${flags[@]}" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for g in gtest-all gtest_main; do
  o="$out/obj/$g.o"
  objs+=("$o")
  [ -f "$o" ] || { echo "  CXX $g.cc"; "$cxx" "${gflags[@]}" -c "$gtest_src/src/$g.cc" -o "$o"; }
done
for p in "${pids[@]}"; do wait "$p"; done

echo "  LD  kernels_test_neon"
"$cxx" -static -pthread "${objs[@]}" -o "$out/kernels_test_neon"

if [ "$#" -eq 0 ]; then set -- --gtest_filter='Kernels*'; fi
echo "  RUN qemu-aarch64 -L $sysroot $out/kernels_test_neon $*"
exec qemu-aarch64 -L "$sysroot" "$out/kernels_test_neon" "$@"
