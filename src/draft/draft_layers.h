// The pieces every K3 draft model is built from, in one place (docs/DRAFT-MODELS.md §5):
// DeepSeek-V3 YaRN RoPE on interleaved pairs, a DeepSeek MLA layer that *does* rotate (unlike the
// target's NoPE MLA) over the draft's own latent cache, the SiLU SwiGLU MLP, and reading the
// draft's tensors from its safetensors with every name and shape checked at load. EAGLE-3 and
// DSpark differ only in how they assemble these (eagle3.cpp, dspark.cpp).
//
// The draft cache holds per position the normed latent and the rotated k_pe ([kv_lora + rope],
// fp32), so attention runs in the absorbed form like the target's MLA: q̃ = Wk_hᵀ q_nope scored
// against the latent, the weighted latent mapped out by Wv_h. Which rows a query sees is the
// caller's: a prefix of the cache (EAGLE's causal chain, DSpark's context + whole block).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "draft/draft_config.h"
#include "storage/checkpoint.h"
#include "tensor/matrix.h"

namespace deltafin {

class ThreadPool;

class Yarn {
 public:
  Yarn(const YarnConfig& y, int64_t rope_dim);
  // Rotates x[rope_dim] in place at `position`: dims 2i and 2i+1 by frequency i.
  void rotate(float* x, int64_t position) const;
  // Score scale (qk_dim)^-1/2 · mscale², mscale = 0.1·mscale_all_dim·ln(factor) + 1.
  float score_scale(int64_t qk_dim) const { return score_scale_ / std::sqrt(float(qk_dim)); }

 private:
  std::vector<double> inv_freq_;
  double cos_scale_ = 1.0;
  float score_scale_ = 1.0f;
};

// The draft's checkpoint: tensors checked by name and shape as they are bound.
class DraftTensors {
 public:
  DraftTensors(std::shared_ptr<const Checkpoint> ck, std::string kind_name);
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols);
  std::vector<float> vector(const std::string& name, int64_t n);
  bool has(const std::string& name) const { return ck_->find(name) != nullptr; }
  uint64_t bound_bytes() const { return bytes_; }  // what the bound tensors occupy

 private:
  const TensorInfo& get(const std::string& name, std::vector<int64_t> shape);
  std::shared_ptr<const Checkpoint> ck_;
  std::string kind_;
  uint64_t bytes_ = 0;
};

struct DraftMla {
  Matrix q_a, q_b, kv_a, kv_b, o;
  std::vector<float> q_a_norm, kv_a_norm;
};
// `prefix` e.g. "layers.0.self_attn."; `in` = the width of u (2·hidden for EAGLE, hidden else).
DraftMla bind_draft_mla(DraftTensors& t, const DraftModelConfig& c, const std::string& prefix,
                        int64_t in);

// How both kinds turn a committed position's taps into one vector: an RMSNorm per tap when the
// config says fc_norm (EAGLE-3.1, lightseek DSpark), then one projection (EAGLE's fc, DSpark's
// context_proj) from taps·hidden to hidden.
struct TapFusion {
  Matrix proj;
  std::vector<std::vector<float>> norms;  // one per tap, or none
};
TapFusion bind_tap_fusion(DraftTensors& t, const DraftModelConfig& c, const std::string& proj);
// out [R][hidden] from taps [R][taps·hidden] (not modified).
void fuse_taps(const DraftModelConfig& c, const TapFusion& f, const float* taps, int64_t R,
               float* out, ThreadPool& pool);

struct DraftMlp {
  Matrix gate, up, down;
};
DraftMlp bind_draft_mlp(DraftTensors& t, const DraftModelConfig& c, const std::string& prefix);

// Cache rows [R][kv_lora + rope] of inputs u [R][in] at `positions`: the normed latent and the
// rotated k_pe.
void draft_kv_rows(const DraftModelConfig& c, const DraftMla& w, const Yarn& yarn, const float* u,
                   int64_t R, const int64_t* positions, float* out, ThreadPool& pool);
// Attention of queries from u [R][in] at `positions` over cache rows [0, visible[r]) (each query
// row its own prefix), written to y [R][hidden] (o_proj applied).
void draft_attention(const DraftModelConfig& c, const DraftMla& w, const Yarn& yarn, const float* u,
                     int64_t R, const int64_t* positions, const float* cache,
                     const int64_t* visible, float* y, ThreadPool& pool);
// y += down(silu(gate·x) ⊙ up·x) for rows x [R][hidden].
void draft_mlp_add(const DraftModelConfig& c, const DraftMlp& w, const float* x, int64_t R,
                   float* y, ThreadPool& pool);
// out = RMSNorm(x; w) row by row with the draft's eps.
void draft_norm(const float* x, const std::vector<float>& w, float eps, int64_t R, int64_t n,
                float* out);

}  // namespace deltafin
