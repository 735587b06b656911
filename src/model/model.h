// The K3 text model: rows in, logits out, one layer after another (docs/MODEL.md §3). A pass
// takes a batch of rows grouped by sequence — a prompt chunk, a block of drafted tokens, the
// current token of several clients, or any mix — and each sequence brings its own State.
// Per-row math (projections, AttnRes, MoE) is batched over all rows; the recurrent parts (KDA
// conv and delta-rule state, MLA attention over the cache) run per sequence. In the MoE each
// selected expert is fetched and applied once for all the rows that chose it.
//
// The model computes; it does not store. It reaches weights only through two narrow interfaces
// (TrunkProvider: a layer's weights; ExpertProvider: the experts of a pass, with the predictor
// hook), which the engine (engine/engine.h) builds from the checkpoint and the options. So this
// folder reads no checkpoint bytes and runs no reader threads (its compute threads: ModelParts).
//
// Exactness: activations are fp32 throughout, weights are used as released (BF16 decoded in
// the kernels, MXFP4 decoded exactly), all routed experts are applied. Splitting a sequence's
// tokens into passes differently (prefill, decode, any split) gives the same logits up to fp32
// summation order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/experts.h"
#include "model/pass_plan.h"
#include "model/state.h"
#include "model/weights.h"

namespace deltafin {

struct SequenceInput {
  State* state = nullptr;
  std::span<const int32_t> tokens;
  // Logits for every row of this sequence (else only its last row).
  bool all_logits = false;
  // Deferred mode (drafted-row verification): KDA/conv state is left as it was and the pass
  // records what Model::commit needs to advance it by the accepted prefix only. The MLA cache
  // and the position advance by all rows (commit truncates them).
  PendingCommit* pending = nullptr;
  // Rows that take the place of some tokens' embedding rows (K3's image input: an image's
  // projector rows at its <|media_pad|> positions, docs/VISION.md §6). Row embed_rows[i] of this
  // sequence (strictly increasing, each < tokens.size()) starts the pass as
  // embed_values[i·hidden, (i+1)·hidden); every other row embeds its token. Empty: none.
  std::span<const int64_t> embed_rows;
  std::span<const float> embed_values;
};

struct PassStats {
  int64_t passes = 0;
  int64_t rows = 0;
  int64_t expert_uses = 0;     // (row, expert) pairs
  int64_t expert_fetches = 0;  // distinct experts fetched per pass, summed
  double seconds = 0;
};

// Attention Residuals bookkeeping per layer (docs/MODEL.md §3.3): how many banked anchors the
// attention-side mix sees, whether the layer banks its incoming partial sum, and how many
// anchors the MLP-side mix (and the output mix, after the last layer) sees.
struct AttnResStep {
  int anchors_before = 0;
  bool bank = false;
  int anchors_after = 0;
};
std::vector<AttnResStep> attn_res_plan(const ModelConfig& c);

// What a model computes with, as the engine assembles it.
struct ModelParts {
  ModelConfig config;
  std::unique_ptr<TrunkProvider> trunk;
  std::unique_ptr<ExpertProvider> experts;
  uint64_t trunk_bytes_per_pass = 0;  // weight bytes a decode pass reads besides experts
  // What the providers read from (the opened checkpoint); released after them.
  std::shared_ptr<const void> keep_alive;
  // The model's own compute threads; null = the process-wide pool (the CLI's --threads). Models
  // loaded side by side in one process (the C API) neither share nor resize each other's.
  std::unique_ptr<ThreadPool> pool;
  // What each pass runs inside, set by the engine: with --gpu, another device is offered the
  // pass's matrix products (engine/device_experts.h: offload_environment). Empty: the pass runs
  // as it is. The model computes the same math either way and does not know which it has.
  std::function<void(const std::function<void()>& pass)> pass_environment;
  // How prompt passes are cut and walked (pass_plan.h); the engine sets it from the memory plan.
  PassPlan pass_plan;
};

class Model {
 public:
  explicit Model(ModelParts parts);
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  ExpertProvider& experts() { return *experts_; }
  // Puts another expert provider in place and returns the one that was (bench's in-RAM
  // reference wraps the store for a while). No pass may run meanwhile.
  std::unique_ptr<ExpertProvider> replace_experts(std::unique_ptr<ExpertProvider> p) {
    std::swap(p, experts_);
    return p;
  }
  const PassStats& pass_stats() const { return pass_stats_; }
  TrunkStats trunk_stats() const { return trunk_->stats(); }
  std::string describe() const;
  // Per-layer prefetch recall (empty unless the expert provider predicts).
  std::vector<LayerRecall> prefetch_recall() const { return experts_->recall(); }

  State new_state() const { return State(config_); }

  // Runs one pass. Returns logits [n, vocab] for, in order, each sequence's requested rows.
  // Every sequence must be distinct and have at least one token.
  std::vector<float> forward(std::span<SequenceInput> seqs);
  // Convenience: one sequence, returns its last row's (or all rows') logits.
  std::vector<float> forward(State& state, std::span<const int32_t> tokens,
                             bool all_logits = false);

  // Advances a state left by a deferred pass by its first `accepted` rows (0..rows).
  void commit(State& state, const PendingCommit& pending, int64_t accepted) const;

  // Draft models (src/draft) compute with two pieces of the target: its embedding table (rows of
  // `tokens` as fp32 [n][hidden]) and, for DSpark, its LM head (logits [n][vocab] of rows the
  // caller has already normed). Both go through the trunk provider, so they stream like a pass.
  void embed(std::span<const int32_t> tokens, float* out);
  void lm_head(const float* rows, int64_t n, float* logits);
  ThreadPool& pool() { return pool_ ? *pool_ : global_pool(); }

  // Weight bytes a decode step streams, excluding routed experts: the trunk once per pass.
  uint64_t trunk_bytes_per_pass() const { return trunk_bytes_per_pass_; }
  uint64_t expert_bytes() const { return experts_->expert_bytes(); }
  // The prefill arrangement: rows per prompt pass (the front ends' prefill chunk) and the block
  // size a pass is computed in.
  const PassPlan& pass_plan() const { return pass_plan_; }
  void set_pass_plan(const PassPlan& p) { pass_plan_ = p; }

 private:
  class Pass;
  std::shared_ptr<const void> keep_alive_;  // first member: destroyed after the providers
  std::unique_ptr<ThreadPool> pool_;        // own threads, else the global pool
  std::function<void(const std::function<void()>&)> pass_environment_;
  ModelConfig config_;
  std::unique_ptr<TrunkProvider> trunk_;
  std::unique_ptr<ExpertProvider> experts_;
  uint64_t trunk_bytes_per_pass_ = 0;
  std::vector<AttnResStep> plan_;
  PassPlan pass_plan_;
  PassStats pass_stats_;
};

}  // namespace deltafin
