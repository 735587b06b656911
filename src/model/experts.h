// How the model reaches routed experts: the narrow interface it computes against. The model asks
// for the experts one pass of a layer needs and gets pinned views (ExpertHandle) as they become
// ready; it never knows where the bytes live (mapped shards, the budgeted SSD-streaming store,
// anything a test supplies). Statistics, prefetch hints and prediction recall come through this
// interface too, so nothing above it needs to know which provider it has.
#pragma once

#include <cstdint>
#include <memory>
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

struct ExpertStats {
  uint64_t requests = 0;      // experts asked for by passes
  uint64_t hits = 0;          // served from RAM without a read
  uint64_t misses = 0;        // needed a read from storage
  uint64_t bytes_read = 0;    // bytes read from storage by the provider
  uint64_t bytes_served = 0;  // expert bytes handed to compute
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;  // prefetched experts that a pass then asked for
  uint64_t prefetch_wasted_bytes = 0;
  double io_wait_s = 0;  // time compute spent waiting for reads
  double read_s = 0;     // time reader threads spent reading
};

// Per (layer, expert) demand counters since start, for the server's engine view: index
// [layer * experts + expert] over all `layers` layers (dense layers stay zero). Empty when the
// provider does not count them.
struct ExpertHeat {
  int layers = 0, experts = 0;
  std::vector<uint64_t> hits, misses;
};

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

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
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
