// The DSpark draft model of K3, one implementation for both MLA checkpoints (docs/DRAFT-MODELS.md
// §4): `Inferact/Kimi-K3-DSpark` (raw-prefix taps) and
// `lightseekorg/kimi-k3-dspark` (AttnRes-mixture taps plus a per-tap fc_norm) differ only in
// their config (tap layers, `aux_hidden_stream`, `fc_norm`, mask id).
//   - Context injection per committed position p: c_p = RMSNorm(context_proj · feat_p;
//     context_norm); each draft layer caches its own latent row kv_a_ℓ · c_p (no input norm),
//     k_pe rotated at p. Rows are built once from the target's real taps and kept.
//   - One pass per proposal over the block [anchor, mask × (B−1)] at positions L .. L+B−1, with
//     K3's embedding: pre-norm MLA layers attending to every context row and every block row (no
//     mask), SiLU MLP, final_norm, then K3's own lm_head. Block rows never enter the context.
//   - Markov-corrected sequential choice: prev = anchor; d_r = argmax(logits_r + w2 · w1[prev]);
//     a deterministic choice, so no q is reported (eagle3.h says why).
//   - Confidence head: sigmoid(w_c · [final-normed hidden_r ; w1[prev_r]] + b_c) per row, the
//     conditional survival whose running product sizes the verify width (DraftProposal
//     confidence).
#pragma once

#include <memory>

#include "draft/draft_layers.h"
#include "draft/draft_model.h"
#include "draft/tap_drafter.h"

namespace deltafin {

struct DSparkLayer {
  std::vector<float> input_norm, post_norm;
  DraftMla attn;
  DraftMlp mlp;
};

struct DSparkWeights {
  TapFusion context;  // context_proj (+ fc_norm.i for lightseek's)
  std::vector<float> context_norm, final_norm;
  std::vector<DSparkLayer> layers;
  Matrix markov_w1, markov_w2;                    // [vocab, rank]
  std::vector<float> confidence_w, confidence_b;  // [hidden (+ rank)], [1]; empty without a head
};

class DSparkModel : public TapDraftModel<DSparkWeights> {
 public:
  DSparkModel(DraftModelConfig c, std::shared_ptr<const Checkpoint> ck);
  uint64_t cache_bytes_per_position() const override {
    return static_cast<uint64_t>(c_.mla.cache_width() * c_.num_layers) * sizeof(float);
  }
  std::unique_ptr<TapDrafter> new_drafter(Model& target) const override;
};

class DSparkDrafter : public TapDrafter {
 public:
  DSparkDrafter(Model& target, std::shared_ptr<const DSparkModel> m);

 protected:
  void reset() override;
  DraftProposal draft(std::span<const int32_t> history, int max_tokens) override;
  void sync(std::span<const int32_t> committed) override;
  DraftRows export_rows(int64_t from) const override;
  void import_rows(const DraftRows& rows, int64_t position) override;

 private:
  void inject_context(int64_t committed);
  std::shared_ptr<const DSparkModel> m_;
  const DraftModelConfig& c_;
  const DSparkWeights& w_;
  std::vector<std::vector<float>> caches_;  // per layer [positions][kv_lora + rope]
  int64_t context_len_ = 0;
};

}  // namespace deltafin
