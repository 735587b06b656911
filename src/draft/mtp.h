// DeepSeek-V3's multi-token-prediction layer as a drafter (docs/FAMILY.md §MTP): the target
// checkpoint's own layer `num_layers` (61 in the release), never a separate folder. Per committed
// position p it reads the target's final-normed hidden h_p (a kFinal tap, model/taps.h) and the
// next token t_{p+1}:
//   x  = eh_proj · [RMSNorm(E_mtp[t_{p+1}]; enorm) ; RMSNorm(h_p; hnorm)]
//   x' = the decoder layer (MLA with decoupled RoPE + MoE) at RoPE position p over its own cache
//   logits = shared_head.head · RMSNorm(x'; shared_head.norm)          (a draft of t_{p+2})
// The layer is run by the model's own layer code (mla_forward, moe_forward over a State of a
// config that has the MTP layer as its one MoE layer), so its math is the main layers' math,
// FP8/INT4 decoding and all; nothing here re-implements attention or experts.
//
// Pairing as EAGLE's: MLA cache row p holds (h_p, t_{p+1}), so h_{L-1} waits for the anchor.
// Committed rows are built from the target's real hidden states (only their attention runs, its
// output is dropped: the cache row is all a committed row leaves); the chain feeds x' (before
// shared_head.norm) as the next step's hidden with the drafted token at position p+1, its rows
// seen by later steps and then dropped. Drafts are argmax (no q), like EAGLE's.
//
// Weights: the layer's tensors are mapped from the target's shards (a second mapping of the same
// files, the page cache shares the bytes) and counted whole in the memory plan as a draft
// model's weights (its routed experts included: they are not served by the budgeted expert
// store), with one latent cache row per committed position as its cache.
#pragma once

#include <memory>
#include <string>

#include "draft/draft_model.h"
#include "draft/tap_drafter.h"
#include "model/experts.h"
#include "model/state.h"
#include "model/weights.h"

namespace deltafin {

struct MtpWeights {
  Matrix embed;  // model.layers.L.embed_tokens [V, H]
  std::vector<float> enorm, hnorm, head_norm;
  Matrix eh_proj;      // [H, 2H]: columns 0..H-1 take the embedding, H..2H-1 the hidden
  LayerWeights layer;  // the decoder layer, bound as a main layer
  Matrix head;         // shared_head.head [V, H]
};

class MtpModel : public DraftModel {
 public:
  // Opens the MTP layer of the model in `model_dir` (config `target`); throws naming the model
  // when it has none ("num_nextn_predict_layers is 0").
  MtpModel(const std::string& model_dir, const ModelConfig& target);
  uint64_t cache_bytes_per_position() const override {
    return static_cast<uint64_t>(layer_config_.mla.cache_width()) * sizeof(float);
  }
  std::unique_ptr<TapDrafter> new_drafter(Model& target) const override;

  // The target's config with the MTP layer as its last layer and its only MoE layer: what the
  // model's layer code and State see.
  const ModelConfig& layer_config() const { return layer_config_; }
  int layer() const { return static_cast<int>(layer_config_.num_layers) - 1; }
  const MtpWeights& weights() const { return w_; }
  ExpertProvider& experts() const { return *experts_; }

 private:
  std::shared_ptr<const Checkpoint> ck_;
  ModelConfig layer_config_;
  MtpWeights w_;
  std::unique_ptr<ExpertProvider> experts_;
};

// The tail features are the hiddens h the target's last layer hands over (final-normed).
class MtpDrafter : public LaggedTapDrafter {
 public:
  MtpDrafter(Model& target, std::shared_ptr<const MtpModel> m);

 protected:
  DraftProposal draft(std::span<const int32_t> history, int max_tokens) override;
  void commit_rows(std::span<const int32_t> history) override;
  // The rows live in state_'s cache of the MTP layer, where the layer code appends them.
  std::span<const float> cache_rows() const override;
  void replace_cache_rows(std::vector<float> rows, int64_t count) override;

 private:
  // x [R][H] = eh_proj · [RMSNorm(E_mtp[tokens]; enorm) ; RMSNorm(h; hnorm)].
  void layer_input(std::span<const int32_t> tokens, const float* h, float* x);
  // Runs the decoder layer on rows x [R][H] at positions cache_len .. cache_len + R - 1,
  // appending their cache rows; with `ffn` the MoE too, leaving x' in x (else x is unchanged).
  void run_layer(float* x, int64_t R, bool ffn);

  std::shared_ptr<const MtpModel> m_;
  const ModelConfig& c_;
  const MtpWeights& w_;
  State state_;  // only the MTP layer's cache is used
  size_t slot_;  // that cache's index in state_.mla()
};

// `--draft mtp`: the MTP layer of the model in `model_dir`.
std::shared_ptr<DraftModel> open_mtp_model(const std::string& model_dir, const ModelConfig& target);

}  // namespace deltafin
