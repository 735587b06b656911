// Per-sequence decoding state: for every KDA layer the recurrent state S (heads x key x value,
// fp32) and the short-convolution history (the last kernel-1 pre-conv inputs of q, k and v); for
// every MLA layer the latent cache (kv_lora latent + the shared k_pe slice per position, fp32).
// AttnRes keeps nothing across positions.
//
// State is a value: copying it is a snapshot, assigning one back restores it. The MLA cache can
// be truncated; KDA state cannot, so drafted-row verification runs the forward pass with a
// KdaRecord (the per-row recurrence inputs) and commits only the accepted prefix (see model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/taps.h"

namespace deltafin {

struct KdaLayerState {
  std::vector<float> S;     // [heads][head_dim (key)][head_dim (value)]
  std::vector<float> conv;  // [conv_kernel - 1][3 * proj_dim]: oldest row first; q | k | v
};

struct MlaLayerCache {
  std::vector<float> rows;  // [positions][kv_lora + rope]
  int64_t width = 0;
  int64_t length() const { return width == 0 ? 0 : static_cast<int64_t>(rows.size()) / width; }
};

// The sizes a model's states have: per KDA layer (floats of S, floats of the conv history), per
// MLA layer the floats of one cache row. What a saved state must match to be restored.
struct StateShape {
  std::vector<std::pair<size_t, size_t>> kda;
  std::vector<int64_t> mla;
  static StateShape of(const ModelConfig& c);
  bool operator==(const StateShape&) const = default;
};

class State {
 public:
  State() = default;
  explicit State(const ModelConfig& c);

  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }
  // Back to an empty sequence (zero state, empty caches); keeps allocations.
  void reset();
  // Drops MLA cache rows past `n` positions and sets the position to n. Only meaningful together
  // with a KDA state that matches n (Model::commit does both).
  void truncate(int64_t n);
  State snapshot() const { return *this; }
  void restore(const State& s);
  uint64_t bytes() const;

  std::vector<KdaLayerState>& kda() { return kda_; }
  const std::vector<KdaLayerState>& kda() const { return kda_; }
  std::vector<MlaLayerCache>& mla() { return mla_; }
  const std::vector<MlaLayerCache>& mla() const { return mla_; }
  // For a model layer index, its slot in kda() or mla() (-1 if the layer is the other kind).
  int kda_slot(int layer) const { return layer_slot_[static_cast<size_t>(layer)].first; }
  int mla_slot(int layer) const { return layer_slot_[static_cast<size_t>(layer)].second; }
  bool compatible(const State& other) const;
  StateShape shape() const;
  // False after a pass that failed midway: the state is then half-updated and must be reset.
  bool consistent() const { return consistent_; }
  void set_consistent(bool v) { consistent_ = v; }
  // The drafter's tap recorder for this sequence (null: no taps are computed). A copy of the
  // state shares it; reset() and truncate() keep its committed rows in step with the position.
  TapRecorder* taps() const { return taps_.get(); }
  void set_taps(std::shared_ptr<TapRecorder> taps) { taps_ = std::move(taps); }

 private:
  int64_t position_ = 0;
  bool consistent_ = true;
  std::vector<KdaLayerState> kda_;
  std::vector<MlaLayerCache> mla_;
  std::vector<std::pair<int, int>> layer_slot_;
  std::shared_ptr<TapRecorder> taps_;
};

// What a forward pass in deferred mode records per KDA layer so the state after only the first k
// of its T rows can be rebuilt: the recurrence inputs per row (normalised k, v, decay alpha, beta)
// and the pre-conv q|k|v inputs (for the conv history).
struct KdaLayerRecord {
  std::vector<float> k, v, alpha;  // [T][heads][head_dim]
  std::vector<float> beta;         // [T][heads]
  std::vector<float> conv_in;      // [T][3 * proj_dim]
};

struct PendingCommit {
  int64_t base_position = 0;           // position before the pass
  int64_t rows = 0;                    // T
  std::vector<KdaLayerRecord> layers;  // one per KDA layer, in State::kda() order
};

}  // namespace deltafin
