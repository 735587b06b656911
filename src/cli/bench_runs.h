// The measured part of `deltafin bench` (cmd_bench.cpp): a warm-up, then repetitions of one
// prompt's prefill and one decode each, a fresh pseudo-random prompt per repetition so none
// replays another's expert reads, with the storage, expert, trunk and GPU counters of every
// phase; and out of core, the same decode served from RAM (the in-RAM reference the bound
// uses). Only counters and times come out; cmd_bench.cpp turns them into figures.
#pragma once

#include <cstdint>
#include <vector>

#include "generate/speculative.h"
#include "gpu/gpu.h"
#include "model/experts.h"
#include "runtime/load.h"

namespace deltafin::cli {

// Counters over the prefill phases of all measured repetitions.
struct PrefillTotals {
  int64_t tokens = 0, passes = 0;
  double seconds = 0;
  uint64_t expert_read = 0, trunk_read = 0, storage_read = 0;
};

// Counters over the decode phases of all measured repetitions.
struct DecodeTotals {
  int64_t tokens = 0, passes = 0, expert_fetches = 0;
  double seconds = 0;
  ExpertStats experts;
  uint64_t trunk_streamed = 0, storage_read = 0;
  double trunk_wait = 0;
};

struct BenchShape {
  int prompt_tokens = 64;
  int gen_tokens = 16;
  int reps = 3;
  bool in_ram_reference = true;  // out of core: also decode the same dimensions from RAM
};

struct BenchRuns {
  PrefillTotals pre;
  DecodeTotals dec;
  DraftStats drafted;  // with a drafter: its decode passes
  std::vector<double> ttft, prefill_tps, decode_tps;
  gpu::Stats gpu_prefill, gpu_decode;  // the GPU backend's products per phase
  // The in-RAM reference: its decode speeds (empty when not run) and its cache hit rate.
  std::vector<double> in_ram_tps;
  double in_ram_hit_rate = 0;
};

// Runs the warm-up, the repetitions and the in-RAM reference on the engine's model.
BenchRuns run_bench_passes(LoadedEngine& engine, const BenchShape& shape);

}  // namespace deltafin::cli
