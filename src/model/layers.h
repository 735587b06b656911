// The layer computations over a batch of rows (internal to the model), each with the family's
// variants chosen from the config (KDA's decay and output gate, MLA's query form and gate, the
// MLP activation, the MoE flavour). Each function reads
// the normed input rows and writes the layer's output rows; recurrent parts run per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/experts.h"
#include "model/pass_arena.h"
#include "model/state.h"
#include "model/weights.h"

namespace deltafin {

class ThreadPool;

struct SeqRows {
  int64_t begin = 0;  // first row of this sequence in the batch
  int64_t count = 0;
  State* state = nullptr;
  PendingCommit* pending = nullptr;  // deferred KDA commit
  int64_t base = 0;                  // position before these rows
  int64_t pass_count = 0;            // this sequence's rows in the whole pass (>= count)
};

struct LayerContext {
  const ModelConfig& c;
  ThreadPool& pool;
  std::span<const SeqRows> seqs;
  int64_t rows;
  // The pass's scratch, handed from sub-layer to sub-layer (KDA and the MoE take theirs from it);
  // null: each call allocates its own.
  PassArena* arena = nullptr;
};

// y[R][hidden] = KDA(u)
void kda_forward(const LayerContext& ctx, const KdaWeights& w, int layer, const float* u, float* y);
// The chunked delta rule for one head over T rows (kda_chunk.cpp). Rows of q, k, v and alpha
// (the per-channel decay) are `row_stride` / `alpha_stride` floats apart, beta values
// `beta_stride` apart; S is [dk][dv], updated.
void kda_chunk_head(float* S, int64_t dk, int64_t dv, int64_t T, const float* q, const float* k,
                    const float* v, const float* alpha, const float* beta, int64_t row_stride,
                    int64_t alpha_stride, int64_t beta_stride, float* o, int64_t o_stride);
// One stepwise delta-rule row for one head (the oracle form; kda.cpp).
void kda_step_head(float* S, int64_t dk, int64_t dv, const float* q, const float* k, const float* v,
                   const float* alpha, float beta, float* e, float* o);
// Sizes a deferred pass's records for `rows` rows starting at position `base`.
void kda_begin_pending(const ModelConfig& c, int64_t base, int64_t rows, PendingCommit& pending);
// Replays the first `accepted` recorded rows of one KDA layer into its state (deferred commit).
void kda_commit(const ModelConfig& c, const KdaLayerRecord& rec, int64_t rows, int64_t accepted,
                KdaLayerState& st);
// y[R][hidden] = NoPE MLA(u) (gated when the config says so; the query through q_a/q_b or one
// q_proj), appending each sequence's rows to its latent cache.
void mla_forward(const LayerContext& ctx, const MlaWeights& w, int layer, const float* u, float* y);
// y (=|+=) W_down · act(W_gate x, W_up x), act the config's SiTU or SiLU
void mlp_forward(const LayerContext& ctx, const MlpWeights& w, const float* x, float* y,
                 bool accumulate);
// y = MoE(x) (latent or plain) + shared experts(x); returns the number of distinct experts fetched.
// `issued` runs once this layer's expert reads are issued (ExpertStep::issued). One block:
// MoePass below with the whole pass as its block.
int64_t moe_forward(const LayerContext& ctx, const MoeTrunkWeights& w, ExpertProvider& experts,
                    int layer, const float* x, float* y, const std::function<void()>& issued = {});

// The MoE of one layer over a pass computed in blocks (model/pass_plan.h): route() each block
// (router, latent input), run_experts() once — the pass's routed-expert step (ExpertStep: every
// chosen expert applied once to all the pass's rows that chose it, at most `block_rows` rows at
// a time), carried out by the expert provider — then finish() each block (weighted sum in id
// order, latent norm, up projection, shared experts). x are the block's normed MLP inputs, the
// same rows to route() and to finish().
class MoePass {
 public:
  MoePass(const LayerContext& pass, const MoeTrunkWeights& w, int64_t block_rows);
  void route(const LayerContext& block, int64_t first_row, const float* x);
  int64_t run_experts(ExpertProvider& experts, int layer, const std::function<void()>& issued);
  // The shared experts of a block, y = shared(x), on their own: what the model computes while
  // the routed experts' reads are in flight (from run_experts' `issued`). finish() with
  // `shared_in_y` then adds the routed part to y instead of the other way round; the sum is
  // the same two terms added once, so the result is bit-identical either way.
  void shared(const LayerContext& block, const float* x, float* y, int layer);
  void finish(const LayerContext& block, int64_t first_row, const float* x, float* y,
              bool shared_in_y = false);

 private:
  void apply_expert(const ExpertWeights& w, std::span<const int64_t> list);
  const LayerContext& pass_;
  const MoeTrunkWeights& w_;
  int64_t block_rows_;
  std::vector<int> ids_;    // [rows][top_k], ascending per row
  std::vector<float> wts_;  // [rows][top_k]
  PassArena own_arena_;     // where the pass has no arena
  float* xi_ = nullptr;     // [rows][latent], from the arena
  float* slot_ =
      nullptr;  // [rows][top_k][latent], from the arena: each (row, slot)'s expert output
  std::vector<bool> chosen_;              // per expert
  std::vector<float> xe_, ge_, ue_, ye_;  // one expert's CPU scratch
};

// The router's choice for every row of `x` (normed MLP inputs): the one top-k shared by the
// MoE and by routing prediction. ids/weights are [rows][top_k], ascending ids per row;
// `experts` is the union over rows, ascending.
struct Routing {
  std::vector<int> ids;
  std::vector<float> weights;
  std::vector<int> experts;
};
Routing route_rows(const LayerContext& ctx, const Matrix& router,
                   const std::vector<float>& score_bias, const float* x);

// Router selection for one row (exposed for tests): top-k by score + bias (ties: lower id),
// weights = the unbiased sigmoid scores renormalised over the selection, times the scaling
// factor. `ids` come out in ascending id order with their weights.
void route_row(const float* logits, const float* bias, int64_t num_experts, int64_t top_k,
               bool renormalize, float scaling, int* ids, float* weights);
// The same with DeepSeek-V3's group step first (MoeConfig::num_groups / topk_groups; 1 / 1 is the
// call above): the experts of all but the topk_groups best groups — a group's score the sum of its
// two best biased scores, ties to the lower group — are not selectable.
void route_row(const float* logits, const float* bias, int64_t num_experts, int64_t top_k,
               bool renormalize, float scaling, int64_t groups, int64_t topk_groups, int* ids,
               float* weights);

}  // namespace deltafin
