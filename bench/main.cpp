// The single main() of deltafin_kernel_bench. bench/CMakeLists.txt links benchmark::benchmark
// (not benchmark_main) and globs bench/*.cpp, so exactly one file defines main: this one. Other
// benchmark files only register benchmarks.
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
