// What one `--trace` span costs (issue 37, docs/PERFORMANCE.md "Tracing"): the span the expert
// loop records, with three arguments, when tracing is off (the flag test every instrumented site
// pays in every run) and when it is on (two clock reads and one append to this thread's buffer).
// The "on" figure includes the fresh memory the buffer takes as it grows, as in a real trace.
//
//   build/bench/deltafin_kernel_bench --benchmark_filter=TraceSpan
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>

#include "core/trace.h"

namespace {

void trace_bench_spans(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    deltafin::TraceSpan span("expert", "compute", {{"layer", i}, {"expert", i & 63}, {"rows", 1}});
    benchmark::ClobberMemory();
    ++i;
  }
}

void BM_TraceSpanOff(benchmark::State& state) {
  trace_bench_spans(state);
}
BENCHMARK(BM_TraceSpanOff);

void BM_TraceSpanOn(benchmark::State& state) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "deltafin-trace-bench.json").string();
  deltafin::trace_start(path, 1 << 30);  // no cap: every span is stored
  trace_bench_spans(state);
  deltafin::trace_abandon();  // nothing written
}
BENCHMARK(BM_TraceSpanOn)->Iterations(1000000);

}  // namespace
