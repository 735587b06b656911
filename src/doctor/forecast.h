// What a model will do on this machine before it is loaded (`deltafin doctor`): decode seconds
// per token and prefill tokens per second predicted from the memory plan the engine would make
// (storage/plan: which trunk units stay resident, how many experts the cache holds), the bytes a
// pass touches and reads, and speeds measured here: the kernels' own products at the model's
// shapes (not a nominal peak), the memory bandwidth and the disk's O_DIRECT read bandwidth.
//
// The model of a pass (docs/DOCTOR.md states it with its assumptions):
//  * compute: every trunk matrix at the measured rate of its format (GEMV bytes/s for decode,
//    GEMM FLOP/s at the pass's block rows for prefill), the routed experts of the pass (top-k
//    per row; the union of a pass's picks under uniform routing) at the MXFP4 rate for their
//    rows per expert, the LM head once per pass, the KDA state and MLA cache traffic at the
//    memory bandwidth, and one fork/join per product;
//  * reads: trunk units the plan streams, and the experts the cache misses (lru_hit_rate), at
//    the probed disk bandwidth;
//  * the timeline the engine runs: a streamed unit waits for its read and starts the read of the
//    next streamed unit (two buffers); a MoE layer's misses are read once its router has run and
//    its experts compute as they arrive; both kinds of reads share the disk's bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/inventory.h"
#include "storage/plan.h"

namespace deltafin {

class ThreadPool;

// Speeds measured on this machine with the active kernel table and the pool's threads.
struct KernelSpeeds {
  // Weight bytes per second of one-row products (decode) on matrices larger than the caches.
  double bf16_gemv = 0, int8_gemv = 0, mxfp4_gemv = 0;
  // FLOP/s of products with `trunk_rows` rows (a prefill block: BF16 and int8 at the model's
  // own trunk shapes, `trunk_shapes` distinct ones, as the mix the model has; f32 at the
  // attention width) and `expert_rows` rows (MXFP4, the expert shape: the mean rows an expert
  // gets in a pass of `pass_rows` rows).
  double bf16_gemm = 0, int8_gemm = 0, f32_gemm = 0, mxfp4_gemm = 0;
  int64_t pass_rows = 0, block_rows = 0, trunk_rows = 0, expert_rows = 0;
  int trunk_shapes = 0;
  // Seconds of one routed expert's three products (gate, up, down) with n rows, at the row
  // counts a prefill block gives an expert (ascending n); interpolated in between.
  std::vector<std::pair<int64_t, double>> expert_row_seconds;
  double product_overhead_s = 0;  // one small in-cache product: the pool's fork and join
  double memory_bandwidth = 0;    // bytes/s (core/sysinfo's probe)
  double fma_peak = 0;            // FLOP/s (kernels::fma_peak_flops), for reference
  double seconds = 0;             // how long measuring took
};

// Measures the speeds at this model's shapes (its trunk products, expert and KDA widths), each
// the median of a few runs after a warm-up (the share of the cores the engine gets now). Takes a
// few seconds and allocates a few hundred MB (matrices larger than the last-level cache).
// `pass_rows`, `block_rows`: the rows of a prefill pass and of its blocks (storage/plan).
KernelSpeeds measure_kernel_speeds(const ModelConfig& c, const TensorTable& tensors,
                                   int64_t pass_rows, int64_t block_rows, ThreadPool& pool);

// One routed expert's seconds with n rows (from expert_row_seconds, a block at a time), and the
// expected seconds of all a MoE layer's experts for a pass of `rows` rows under uniform routing:
// each expert gets Binomial(rows, k/E) rows.
double expert_seconds(const KernelSpeeds& s, double n);
double expected_expert_seconds(const ModelConfig& c, const KernelSpeeds& s, int64_t rows);

// Rows per routed expert in a pass of `rows` rows (top-k of E under uniform routing), and the
// experts that pass touches per MoE layer (measure_kernel_speeds sets expert_rows from it).
double experts_touched(const ModelConfig& c, int64_t rows);
int64_t rows_per_expert(const ModelConfig& c, int64_t rows);

// The expert cache's hit rate under LRU in steady state, for passes of `rows` rows with uniform
// routing: a pass touches each layer's experts once, in layer order, so an expert a pass used is
// still cached when it is next used only if every expert touched in between fits in the cache.
double lru_hit_rate(const ModelConfig& c, const MemoryPlan& plan, int64_t rows);

// A drafter next to the target: its weights (read once per draft step), the drafts verified
// per pass and the tokens a pass yields at the drafter's documented acceptance.
struct DraftAssumption {
  uint64_t weight_bytes = 0;
  int drafts = 0;
  double tokens_per_pass = 1;
};

struct PassCost {
  double seconds = 0;
  double compute_s = 0;      // all compute at the measured rates
  double read_s = 0;         // all reads at the drives' bandwidth (trunk: the model's drive)
  double touched_bytes = 0;  // weight bytes the pass computes with
  double read_bytes = 0;     // bytes it reads from the disk
  double experts = 0;        // routed experts it applies (all MoE layers)
};

struct Forecast {
  PassCost decode;  // one decoded token (a one-row pass at position prompt_tokens)
  double decode_s_per_token = 0;
  PassCost prefill;  // the whole prompt: all its passes
  int64_t prefill_passes = 0;
  double prefill_tokens_per_s = 0;
  double expert_hit_rate = 0;  // the cache's share of all experts
  // With a drafter (when given): one verify pass of 1 + drafts rows plus the draft steps,
  // divided by the tokens a pass yields.
  PassCost verify;
  double draft_s_per_token = 0;
  std::string bound;  // "disk" or "compute" (decode)
};

// The forecast for a prompt of `prompt_tokens` tokens and the tokens decoded after it. With
// `home_bandwidth` > 0 a home drive of that read bandwidth serves routed-expert reads beside the
// model's drive (homes hold experts; the trunk still streams from the model's drive alone).
Forecast forecast(const ModelConfig& c, const TensorTable& tensors, const MemoryPlan& plan,
                  const KernelSpeeds& speeds, double disk_bandwidth, int64_t prompt_tokens,
                  const DraftAssumption* draft = nullptr, double home_bandwidth = 0);

}  // namespace deltafin
