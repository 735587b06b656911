// How the model reaches routed experts: the narrow interface it computes against. The model hands
// over the routed-expert step of one MoE layer pass (ExpertStep: which experts, which rows chose
// each, and the math of one expert) and the provider carries it out — when each expert's bytes
// arrive, in which order experts run, whether several go to another device together. The model
// never knows where the bytes live (mapped shards, the budgeted SSD-streaming store, anything a
// test supplies) nor how the step is scheduled. Statistics, prefetch hints and prediction recall
// come through this interface too, so nothing above it needs to know which provider it has.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "tensor/matrix.h"

namespace deltafin {

// One routed expert's matrices: w1 = gate [I, Hl], w2 = down [Hl, I], w3 = up [I, Hl].
struct ExpertWeights {
  Matrix w1, w2, w3;
};

// A pinned view: the weights stay valid (and resident) while the handle lives.
using ExpertHandle = std::shared_ptr<const ExpertWeights>;

// One drive experts are read from: the model folder, or a home holding copies.
struct SourceStats {
  std::string name;              // "model" or the home's folder
  double probe_bytes_per_s = 0;  // its bandwidth as `deltafin place` probed it (0: unknown)
  uint64_t experts = 0;          // experts it holds (the model folder: all)
  uint64_t reads = 0;            // reads it served (a whole expert, or a piece of one)
  uint64_t split_reads = 0;      // of those, pieces of an expert read from several drives at once
  uint64_t bytes_read = 0;
  double busy_s = 0;        // time with at least one of its reads in flight
  uint64_t hedges = 0;      // late reads elsewhere that this drive was asked to repeat
  uint64_t hedge_wins = 0;  // of those, the ones it finished first
  uint64_t failures = 0;    // reads that failed here (read error, checksum) and fell back
  bool bad = false;         // not used for the rest of the run (said once on stderr)
  std::string bad_reason;
  // Read bandwidth while busy (bytes / busy time).
  double bytes_per_s() const { return busy_s > 0 ? static_cast<double>(bytes_read) / busy_s : 0; }
};

struct ExpertStats {
  uint64_t requests = 0;      // experts asked for by passes
  uint64_t hits = 0;          // served from RAM without a read
  uint64_t misses = 0;        // needed a read from storage
  uint64_t bytes_read = 0;    // bytes read from storage by the provider
  uint64_t bytes_served = 0;  // expert bytes handed to compute
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;  // prefetched experts that a pass then asked for
  uint64_t prefetch_wasted_bytes = 0;
  double io_wait_s = 0;              // time compute spent waiting for reads
  double read_s = 0;                 // time reader threads spent reading
  std::vector<SourceStats> sources;  // per drive (empty: one source, not broken down)
};

// Per (layer, expert) demand counters since start, for the server's engine view: index
// [layer * experts + expert] over all `layers` layers (dense layers stay zero). Empty when the
// provider does not count them.
struct ExpertHeat {
  int layers = 0, experts = 0;
  std::vector<uint64_t> hits, misses;
};

// The per-drive figures as `--json` / `bench --json` / the C API's stats print them ("homes": the
// model folder first, then each home), and as one `--stats` line.
nlohmann::json sources_json(const std::vector<SourceStats>& sources);
std::string describe_source(const SourceStats& s);

// Counters accumulated between two snapshots.
ExpertStats operator-(const ExpertStats& a, const ExpertStats& b);
ExpertStats& operator+=(ExpertStats& a, const ExpertStats& b);

// How well one layer's routing was predicted.
struct LayerRecall {
  uint64_t predicted_hits = 0;  // requested experts that had been predicted
  uint64_t requested = 0;       // requested experts in layers that had a prediction
  double ema = 0;               // recent recall (exponential moving average over passes)
  uint64_t samples = 0;
  bool gated = false;  // predictions too poor to be worth their reads right now
};

// The experts of one pass of one layer, delivered as they become ready. Callers take every item.
class ExpertBatch {
 public:
  virtual ~ExpertBatch() = default;
  // Blocks until some not-yet-taken expert is ready; returns its index into the request list and
  // its handle. Throws IoError if its read failed. Returns false when all have been taken.
  virtual bool next(size_t& index, ExpertHandle& handle) = 0;
};

// The routed-expert step of one MoE layer pass (docs/MODEL.md §3.8) as the model states it: every
// expert in `experts` applied once to the latent rows that chose it,
//   out[(r, s)] = W2_e · SiTU(W1_e · in[r], W3_e · in[r])   for each (row r, slot s) choosing e.
// `apply` is that math on the CPU for one expert over its users; `activate` is the SiTU between
// the gate/up and the down products, for a device that runs the products itself. Each expert
// writes only its own users' outputs, so the order experts run in never shows in the result.
struct ExpertStep {
  int layer = 0;
  std::span<const int> experts;  // distinct ids, ascending
  // users[e]: the (row * top_k + slot) entries that chose expert e (indexed by expert id).
  std::span<const std::vector<int64_t>> users;
  int64_t rows = 0, top_k = 0;
  const float* in = nullptr;  // [rows][in_dim]: the latent inputs
  int64_t in_dim = 0, inner_dim = 0;
  float* out = nullptr;  // [rows * top_k][in_dim]: one output per (row, slot)
  std::function<void(const ExpertWeights& w, std::span<const int64_t> users)> apply;
  std::function<void(const float* gate, const float* up, int64_t n, float* h)> activate;
  // Called once the step's reads are all requested: the model's routing prediction for the next
  // layer goes here, so prefetch hints never queue ahead of the reads this pass waits for.
  std::function<void()> issued;
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Carries out `step`: every listed expert applied exactly once (ExpertStep). Throws IoError
  // when an expert's read fails. The storage providers apply each expert on the CPU as soon as
  // its weights are ready (storage/expert_step.h); the engine's DeviceExperts gives prefill
  // passes' experts to the GPU in groups.
  virtual void run(const ExpertStep& step) = 0;
  // Bytes of one expert as stored (what applying it reads).
  virtual uint64_t expert_bytes() const = 0;
  // Starts whatever reads the listed experts need (all of them together) and returns them as
  // they arrive. `experts` are distinct ids of one layer.
  virtual std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) = 0;
  // One expert, blocking.
  virtual ExpertHandle acquire(int layer, int expert) = 0;
  // The predictor hook: a pass of `layer` will likely want these experts soon; never waited on.
  virtual void prefetch(int layer, std::span<const int> experts) {
    (void)layer;
    (void)experts;
  }
  // Whether prefetch hints do anything (the model only predicts routing when they do).
  virtual bool wants_prefetch() const { return false; }
  // Per-layer recall of the predictions (empty when the provider does not score them).
  virtual std::vector<LayerRecall> recall() const { return {}; }
  virtual ExpertStats stats() const = 0;
  virtual ExpertHeat heat() const { return {}; }
  virtual std::string describe() const = 0;
};

}  // namespace deltafin
