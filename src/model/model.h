// The K3 text model: rows in, logits out, one layer after another (K3-SPEC §3). A pass takes a
// batch of rows grouped by sequence — a prompt chunk, a block of drafted tokens, the current
// token of several clients, or any mix — and each sequence brings its own State. Per-row math
// (projections, AttnRes, MoE) is batched over all rows; the recurrent parts (KDA conv and
// delta-rule state, MLA attention over the cache) run per sequence. In the MoE each selected
// expert is fetched and applied once for all the rows that chose it.
//
// Exactness: activations are fp32 throughout, weights are used as released (BF16 decoded in
// the kernels, MXFP4 decoded exactly), all routed experts are applied. Splitting a sequence's
// tokens into passes differently (prefill, decode, any split) gives the same logits up to fp32
// summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "experts/provider.h"
#include "experts/store.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/plan.h"
#include "model/state.h"
#include "model/weights.h"

namespace deltafin {

class ThreadPool;

struct SequenceInput {
  State* state = nullptr;
  std::span<const int32_t> tokens;
  // Logits for every row of this sequence (else only its last row).
  bool all_logits = false;
  // Deferred mode (drafted-row verification): KDA/conv state is left as it was and the pass
  // records what Model::commit needs to advance it by the accepted prefix only. The MLA cache
  // and the position advance by all rows (commit truncates them).
  PendingCommit* pending = nullptr;
};

struct PassStats {
  int64_t passes = 0;
  int64_t rows = 0;
  int64_t expert_uses = 0;     // (row, expert) pairs
  int64_t expert_fetches = 0;  // distinct experts fetched per pass, summed
  double seconds = 0;
};

// Attention Residuals bookkeeping per layer (K3-SPEC §3.3): how many banked anchors the
// attention-side mix sees, whether the layer banks its incoming partial sum, and how many anchors
// the MLP-side mix (and the output mix, after the last layer) sees.
struct AttnResStep {
  int anchors_before = 0;
  bool bank = false;
  int anchors_after = 0;
};
std::vector<AttnResStep> attn_res_plan(const ModelConfig& c);

struct LoadOptions {
  BindOptions bind;
  // Plain mmap paging of the shards (no budget, no store): the page cache does all I/O.
  bool mmap = false;
  PlanOptions plan;  // memory budget and what it must hold
  CachePolicy cache_policy = CachePolicy::kLRU;
  int readers = 4;
  bool direct_io = true;
  bool prefetch = true;     // predict the next layer's experts and read them ahead
  std::string heat_file;    // persisted expert use counts ("" = none)
  bool print_plan = false;  // write the plan to stderr
  // -1: passes run on the process-wide pool (the CLI sets it with --threads); >= 0: the model
  // owns a pool of that many threads (0 = one per physical core), so models loaded side by side
  // in one process (the C API) neither share nor resize each other's threads.
  int threads = -1;
  // Replaces the default memory-mapped expert provider (the SSD-streaming store, tests).
  std::function<std::unique_ptr<ExpertProvider>(const ModelConfig&, const Checkpoint&,
                                                ExpertFormat)>
      make_experts;
};

class Model {
 public:
  // Opens a checkpoint folder: config, shards, inventory check, weight binding. Throws Error.
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const InventoryReport& inventory() const { return inventory_; }
  ExpertProvider& experts() { return *experts_; }
  const PassStats& pass_stats() const { return pass_stats_; }
  TrunkStats trunk_stats() const { return trunk_->stats(); }
  // The memory plan (absent in mmap mode).
  const std::optional<MemoryPlan>& plan() const { return plan_mem_; }
  std::string describe() const;
  // Per-layer prefetch recall (empty unless the expert store predicts).
  std::vector<LayerRecall> prefetch_recall() const;

  State new_state() const { return State(config_); }

  // Runs one pass. Returns logits [n, vocab] for, in order, each sequence's requested rows.
  // Every sequence must be distinct and have at least one token.
  std::vector<float> forward(std::span<SequenceInput> seqs);
  // Convenience: one sequence, returns its last row's (or all rows') logits.
  std::vector<float> forward(State& state, std::span<const int32_t> tokens,
                             bool all_logits = false);

  // Advances a state left by a deferred pass by its first `accepted` rows (0..rows).
  void commit(State& state, const PendingCommit& pending, int64_t accepted) const;

  // Weight bytes a decode step streams, excluding routed experts: the trunk once per pass.
  uint64_t trunk_bytes_per_pass() const;
  uint64_t expert_bytes() const { return expert_bytes_; }

 private:
  Model() = default;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  InventoryReport inventory_;
  std::unique_ptr<TrunkProvider> trunk_;
  std::unique_ptr<ExpertProvider> experts_;
  uint64_t expert_bytes_ = 0;
  std::vector<AttnResStep> plan_;
  std::optional<MemoryPlan> plan_mem_;
  bool prefetch_ = false;
  PassStats pass_stats_;
  std::unique_ptr<ThreadPool> pool_;  // own threads (LoadOptions::threads >= 0), else global
};

}  // namespace deltafin
