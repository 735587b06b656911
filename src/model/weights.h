// The trunk weights of one layer (everything but the routed experts) and the globals, bound to
// bytes: big matrices are zero-copy views (kernels decode BF16 in place); small vectors (norms,
// conv taps, biases) are converted to fp32 copies once, with derived constants precomputed
// (exp(A_log) per head, the AttnRes score vector norm ⊙ proj, which is exact in fp32).
//
// The model reaches a layer's weights through a TrunkProvider (acquire before the layer's
// compute, release after), so that trunk layers that do not fit in memory can be streamed
// without touching model code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace deltafin {

struct TensorInfo;

struct KdaWeights {
  // g: the output gate's full-rank g_proj (K3) or the up half g_b_proj of the low-rank gate,
  // whose down half is g_a (Kimi-Linear; invalid for K3).
  Matrix q, k, v, f_a, f_b, b, g, g_a, o;
  std::vector<float> q_conv, k_conv, v_conv;  // [proj_dim][conv_kernel], tap 0 = oldest
  std::vector<float> dt_bias;                 // [proj_dim]
  std::vector<float> a_exp;                   // exp(A_log[h]) for the num_heads real entries
  std::vector<float> o_norm;                  // [head_dim]
};

struct MlaWeights {
  // The query: q_a, its norm and q_b (q_lora_rank > 0), or the one q (q_lora_rank 0).
  Matrix q, q_a, q_b, kv_a, kv_b, g, o;  // g invalid when the config has no output gate
  std::vector<float> q_a_norm, kv_a_norm;
};

struct MlpWeights {
  Matrix gate, up, down;
};

struct MoeTrunkWeights {
  Matrix router;                   // [num_experts, hidden]
  std::vector<float> score_bias;   // e_score_correction_bias, selection only
  Matrix down, up;                 // routed_expert_down_proj / up_proj (latent MoE only)
  std::vector<float> latent_norm;  // routed_expert_norm (empty when latent_moe_use_norm = false)
  MlpWeights shared;               // invalid when there are no shared experts
};

struct LayerWeights {
  int layer = 0;
  std::vector<float> input_norm, post_norm;
  std::vector<float> attn_res_score, mlp_res_score;  // res_norm ⊙ res_proj (AttnRes only)
  KdaWeights kda;
  MlaWeights mla;
  MlpWeights dense;
  MoeTrunkWeights moe;
};

// The tail of the model: output AttnRes mix (AttnRes only), final norm, LM head.
struct HeadWeights {
  Matrix lm_head;  // [vocab, hidden] (the embedding when tied)
  std::vector<float> final_norm, out_res_score;
};

// What the expert prefetcher needs of an MoE layer to predict its routing ahead of time.
struct RouterWeights {
  Matrix router;
  std::vector<float> post_norm;  // the layer's post_attention_layernorm
  std::vector<float> score_bias;
};

// Finds a tensor's metadata and bytes by name (throws if absent).
using TensorLookup =
    std::function<std::pair<const TensorInfo*, const uint8_t*>(const std::string&)>;

// A weight matrix viewing `bytes` (BF16 or F32, checked; throws naming the tensor).
Matrix weight_matrix(const TensorInfo& t, const uint8_t* bytes);
// A vector (norm weights, biases) as fp32, decoded from F32 or BF16 (throws naming the tensor).
std::vector<float> weight_vector(const TensorInfo& t, const uint8_t* bytes);
// The matrix `name` through `lookup`: BF16 / F32, or FP8 E4M3 with its `name_scale_inv` block
// scales (DeepSeek-V3 / Kimi K2's trunk linears): the stored dtype decides, as the inventory does.
Matrix lookup_matrix(const TensorLookup& lookup, const std::string& name);
// The vector `name` through `lookup`, as weight_vector decodes it.
std::vector<float> lookup_vector(const TensorLookup& lookup, const std::string& name);
LayerWeights bind_layer(const ModelConfig& c, int layer, const TensorLookup& lookup);
HeadWeights bind_head(const ModelConfig& c, const TensorLookup& lookup);
RouterWeights bind_router(const ModelConfig& c, int layer, const TensorLookup& lookup);
// The tensor names of the head unit (lm_head, or the embedding when tied, and the output norms).
std::vector<std::string> head_tensors(const ModelConfig& c);
// The tensors a RouterWeights binds.
std::vector<std::string> router_tensors(const ModelConfig& c, int layer);

// Lossy, opt-in (--trunk int8): every BF16 matrix of the trunk (not the embedding, not the
// routed experts) as per-row int8 with an f16 scale (absmax / 127, round to nearest even).
Matrix quantize_int8(const Matrix& m, std::vector<uint8_t>& storage);
void quantize_layer_int8(LayerWeights& w, std::vector<std::vector<uint8_t>>& storage);
void quantize_head_int8(HeadWeights& w, std::vector<std::vector<uint8_t>>& storage);
// Bytes a matrix of this shape takes in int8 (data + scales).
uint64_t int8_bytes(int64_t rows, int64_t cols);

struct TrunkStats {
  uint64_t bytes_streamed = 0;  // trunk bytes read per pass (layers that are not resident)
  double wait_s = 0;            // compute time spent waiting for them
  double read_s = 0;
  // The most streamed units read (or being read) ahead of the one computing at once.
  int64_t read_ahead_peak = 0;
};

class TrunkProvider {
 public:
  virtual ~TrunkProvider() = default;
  // Embedding rows of `tokens` as fp32, [n][hidden].
  virtual void embed(std::span<const int32_t> tokens, float* out) = 0;
  // Layer `layer`'s weights, valid until release(layer). May block on a read.
  virtual const LayerWeights& acquire(int layer) = 0;
  virtual void release(int layer) = 0;
  virtual const HeadWeights& acquire_head() = 0;
  virtual void release_head() = 0;
  // Router of an MoE layer for routing prediction (nullptr when not kept).
  virtual const RouterWeights* router(int layer) const {
    (void)layer;
    return nullptr;
  }
  virtual TrunkStats stats() const { return {}; }
  virtual std::string describe() const = 0;
};

}  // namespace deltafin
