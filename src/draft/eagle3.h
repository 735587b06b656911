// The EAGLE-3 / 3.1 MLA draft model of K3 (`lightseekorg/kimi-k3-eagle3.1-mla`, and 3.0 with
// its two flags off), exactly as docs/DRAFT-MODELS.md §3 describes it:
//   - taps: the raw AttnRes partials after the configured target layers, fused per committed
//     position as g = fc · concat(RMSNorm(tap_i; fc_norm.i)) (3.0: without the norms);
//   - one MLA layer (YaRN RoPE on, whatever `mla_use_nope` says) over the draft's own latent
//     cache; its input is [RMSNorm(E[x]) ; RMSNorm(h; hidden_norm)] with K3's embedding E (the
//     checkpoint's copy is never read), its residual h;
//   - pairing: cache row p holds (g_p, x_{p+1}) at RoPE position p, so g_{L-1} stays pending
//     until the anchor is known; committed rows are always rebuilt from the target's real taps;
//   - a top-1 chain: step 1 runs (g_{L-1}, anchor) at L-1, step j the previous step's hidden
//     (3.1: the normed y; 3.0: the pre-norm r) with d_{j-1}; chain rows are seen by later steps,
//     then dropped. Logits come from the draft's own lm_head. The chain is a deterministic
//     drafter (no q): reporting softmax q for an argmax draft would bias sampling (the draft
//     was never drawn from q), so under sampling a draft is kept while it equals the token the
//     target samples — exact, and seeded output equals plain decoding's.
// Committing only builds the latent row of each new position (fc, two norms, kv_a): the chain
// is the only part that runs the whole layer and the head.
#pragma once

#include <memory>

#include "draft/draft_layers.h"
#include "draft/draft_model.h"
#include "draft/tap_drafter.h"

namespace deltafin {

struct Eagle3Weights {
  TapFusion fc;  // fc (+ fc_norm.i in 3.1)
  std::vector<float> hidden_norm, input_norm, post_norm, norm;
  DraftMla attn;
  DraftMlp mlp;
  Matrix lm_head;
};

class Eagle3Model : public TapDraftModel<Eagle3Weights> {
 public:
  // Binds every tensor (throws naming a missing or mis-shaped one).
  Eagle3Model(DraftModelConfig c, std::shared_ptr<const Checkpoint> ck);
  uint64_t cache_bytes_per_position() const override {
    return static_cast<uint64_t>(c_.mla.cache_width()) * sizeof(float);
  }
  std::unique_ptr<TapDrafter> new_drafter(Model& target) const override;
};

// The tail features are the fused g of the taps.
class Eagle3Drafter : public LaggedTapDrafter {
 public:
  Eagle3Drafter(Model& target, std::shared_ptr<const Eagle3Model> m);
  // g = the fused feature of one position's taps [taps][hidden].
  void fuse(const float* taps, float* g) const;

 protected:
  DraftProposal draft(std::span<const int32_t> history, int max_tokens) override;
  void commit_rows(std::span<const int32_t> history) override;

 private:
  // u [R][2·hidden] = [RMSNorm(E[x_r]; input_layernorm) ; RMSNorm(h_r; hidden_norm)].
  void layer_input(std::span<const int32_t> tokens, const float* h, float* u);

  std::shared_ptr<const Eagle3Model> m_;
  const DraftModelConfig& c_;
  const Eagle3Weights& w_;
};

}  // namespace deltafin
