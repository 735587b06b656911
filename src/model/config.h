// The model configuration, read from the checkpoint's config.json. `architectures` chooses the
// family (K3: KimiK3ForConditionalGeneration with the text model under text_config; Kimi-Linear:
// KimiLinearForCausalLM, the file is the text config; DeepSeek-V3 / Kimi K2: DeepseekV3ForCausalLM
// flat, or KimiK25ForConditionalGeneration with it under text_config), and the family's parser
// turns its fields
// into one ModelConfig whose component choices (Activation, ResidualForm, MoeFlavour, KdaDecay,
// the MLA query form, the tensor names) are all the forward pass and the loader ever look at:
// nothing below the parser asks which family it runs. Every field the forward pass uses is
// validated, with errors naming the field, what was expected and what was found. Nothing is
// hard-coded to a release's sizes: the layer schedule and all dimensions come from the file
// (ranks that only the tensors know, such as f_a_proj's, are read from the shapes). The quantised
// formats (MXFP4, FP8 with 128x128 block scales, INT4 pack-quantized) are declared here from
// quantization_config; the stored tensors are checked against the declaration (inventory.h).
// docs/ARCHITECTURE.md ("Model families") says where each difference lives; docs/FAMILY.md is
// the math of each family as differences from docs/MODEL.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace deltafin {

enum class LayerKind { kKDA, kMLA };

// Which model a checkpoint is (chosen by `architectures`). Only the parser and the tensor
// inventory look at it; everything else reads the component choices below.
enum class Family { kK3, kKimiLinear, kDeepseekV3 };
const char* family_name(Family f);

// The activation of every gated MLP (dense, shared and routed experts):
// SiTU (K3, docs/MODEL.md §3.7) or SiLU (Kimi-Linear, DeepSeek-V3/K2: down(silu(gate) ⊙ up)).
enum class Activation { kSiTU, kSiLU };

// The residual stream of the decoder loop: K3's Attention Residuals (banked anchors mixed before
// every sub-layer, §3.3) or the plain pre-norm stream h += f(RMSNorm(h)) (Kimi-Linear, DeepSeek).
enum class ResidualForm { kAttnRes, kPreNorm };

// How the routed experts sit in an MoE layer: K3's latent MoE (experts work in a latent space
// entered by routed_expert_down_proj and left by a norm and routed_expert_up_proj, §3.8) or the
// plain MoE (experts read and write the hidden row; Kimi-Linear, DeepSeek-V3/K2).
enum class MoeFlavour { kLatent, kPlain };

// KDA's per-channel decay g (α = exp(g)): K3's lb·σ(exp(A_log)·z), bounded below by lb, or
// Kimi-Linear's −exp(A_log)·softplus(z), unbounded (docs/FAMILY.md KL.5).
enum class KdaDecay { kBoundedSigmoid, kSoftplus };

struct KdaConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // key and value
  int64_t conv_kernel = 0;
  KdaDecay decay = KdaDecay::kBoundedSigmoid;
  float gate_lower_bound = -5.0f;  // kBoundedSigmoid only
  // The output gate: K3's one full-rank g_proj, or Kimi-Linear's g_b_proj · g_a_proj.
  bool low_rank_output_gate = false;
  int64_t proj_dim() const { return num_heads * head_dim; }
  // K3 stores A_log padded to max(head_dim, num_heads) entries; only the first num_heads are
  // real (Kimi-Linear stores exactly num_heads, as [1, 1, heads, 1]).
  int64_t a_log_len() const { return head_dim > num_heads ? head_dim : num_heads; }
};

// The rotary position encoding of MLA's qk_rope_dim slice (docs/FAMILY.md "RoPE: YaRN on
// interleaved pairs"): off for K3 and Kimi-Linear (NoPE: the slice is never rotated), DeepSeek-V3's
// YaRN for the DeepSeek-V3 / Kimi K2 family. factor 1 (no rope_scaling) is plain RoPE.
struct RopeConfig {
  bool enabled = false;
  double theta = 10000.0;
  double factor = 1.0;
  double original_max_positions = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct MlaConfig {
  int64_t num_heads = 0;
  // > 0: the query goes through q_a_proj, q_a_layernorm, q_b_proj (K3, DeepSeek-V3/K2);
  // 0: one q_proj (Kimi-Linear's q_lora_rank null).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;  // rotated only where rope.enabled (DeepSeek-V3 / K2); K3: NoPE
  int64_t v_head_dim = 0;
  bool output_gate = true;
  // ε of q_a_layernorm and kv_a_layernorm: the modeling code's class default in every family.
  float latent_eps = 1e-6f;
  RopeConfig rope;
  int64_t q_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t cache_width() const { return kv_lora_rank + qk_rope_dim; }
};

struct MoeConfig {
  MoeFlavour flavour = MoeFlavour::kLatent;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t num_shared_experts = 0;
  int64_t intermediate = 0;  // per routed expert
  int64_t latent_dim = 0;    // routed_expert_hidden_size (kLatent only)
  bool latent_norm = true;   // kLatent only
  // The router (sigmoid scores, correction bias for selection only, weights from the unbiased
  // scores): renormalise the k weights, then multiply them by the scaling factor. The parser
  // folds each family's rule into `renormalize` (Kimi-Linear: moe_renormalize and k > 1).
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  // Group-limited selection (DeepSeek-V3's n_group / topk_group): experts in num_groups
  // consecutive groups, only the topk_groups best groups (by the sum of their two best biased
  // scores) compete. 1 / 1: no group step.
  int64_t num_groups = 1;
  int64_t topk_groups = 1;
  int64_t shared_intermediate() const { return num_shared_experts * intermediate; }
};

// How the routed experts are stored: K3's MXFP4 (compressed-tensors mxfp4-pack-quantized), plain
// BF16, FP8 E4M3 with 128x128 block scales (K2-Instruct, DeepSeek-V3), or INT4 pack-quantized
// with BF16 group scales (K2-Thinking, K2.5).
enum class ExpertFormat { kMXFP4, kBF16, kFP8, kInt4 };
const char* expert_format_name(ExpertFormat f);

// Where a family's tensors are named differently (docs/FAMILY.md: K3 `language_model.model.…`,
// Kimi-Linear `model.…` and `lm_head.…`, DeepSeek-V3 / K2 `model.…` with `mlp.` MoE blocks and
// gate_proj / up_proj / down_proj experts; K2.5 `language_model.model.…`).
struct TensorNames {
  std::string prefix = "language_model.";  // before `model.` and `lm_head.`
  std::string moe_block = "block_sparse_moe.";
  // A routed expert's gate, down and up projections (w1, w2, w3 in K3's naming).
  std::array<std::string, 3> expert_proj = {"w1", "w2", "w3"};
  std::string embed() const { return prefix + "model.embed_tokens.weight"; }
  std::string final_norm() const { return prefix + "model.norm.weight"; }
  std::string lm_head() const { return prefix + "lm_head.weight"; }
  std::string layer(int64_t i) const;
  // The MoE block of a layer (`…block_sparse_moe.`, `…mlp.`) and a routed expert in it.
  std::string moe(int64_t i) const { return layer(i) + moe_block; }
  std::string expert(int64_t i, int64_t e) const;
};

struct ModelConfig {
  std::string path;  // the config.json read
  Family family = Family::kK3;
  // The release's model_type (kimi_k3, kimi_linear, kimi_k2, deepseek_v3, kimi_k25): what inspect
  // names; nothing computes from it.
  std::string model_type;
  Activation activation = Activation::kSiTU;
  ResidualForm residual = ResidualForm::kAttnRes;
  TensorNames names;
  int64_t hidden = 0;
  int64_t num_layers = 0;
  int64_t vocab = 0;
  int64_t dense_intermediate = 0;
  int64_t first_k_dense = 0;
  int64_t attn_res_block = 0;  // kAttnRes only
  int64_t max_positions = 0;
  float rms_eps = 1e-5f;
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  bool tie_embeddings = false;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  std::vector<int64_t> eos_token_ids;  // all end ids (a config may list several); [0] == eos
  int64_t pad_token_id = -1;
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  // Whether the routed experts are declared quantised (quantization_config present), and in which
  // format (K3: MXFP4). The inventory holds the tensors to it.
  bool quantized_experts = false;
  ExpertFormat quantized_format = ExpertFormat::kMXFP4;
  // Every other linear of the trunk stored as FP8 E4M3 with weight_scale_inv block scales
  // (quantization_config quant_method fp8: K2-Instruct, DeepSeek-V3).
  bool fp8_trunk = false;
  // Multi-token-prediction layers after the decoder (DeepSeek-V3's num_nextn_predict_layers):
  // their tensors are layers num_layers .. num_layers + mtp_layers - 1, used only by a drafter.
  int64_t mtp_layers = 0;
  std::vector<LayerKind> layer_kinds;  // 0-based, one per layer
  // The top-level vision_config object as text ("" when absent). It is parsed only for a
  // checkpoint that holds vision tensors (model/vision_config.h: vision_config_of), so a
  // text-only checkpoint's placeholder object is never judged.
  std::string vision_config_json;

  bool is_dense(int64_t layer) const { return layer < first_k_dense; }
  bool is_mla(int64_t layer) const { return layer_kinds[layer] == LayerKind::kMLA; }
  int64_t num_kda_layers() const;
  int64_t num_mla_layers() const;
  int64_t num_moe_layers() const { return num_layers - first_k_dense; }
  // The width routed experts read and write: the latent width, or the hidden width.
  int64_t expert_dim() const {
    return moe.flavour == MoeFlavour::kLatent ? moe.latent_dim : hidden;
  }
  ExpertFormat expert_format() const {
    return quantized_experts ? quantized_format : ExpertFormat::kBF16;
  }
};

// Parses and validates config.json text. `path` is used in error messages. (Reading it from a
// checkpoint folder: load_config in storage/checkpoint.h.)
ModelConfig parse_config(const std::string& json_text, const std::string& path);

}  // namespace deltafin
