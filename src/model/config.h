// The K3 model configuration, read from the checkpoint's config.json (top-level
// KimiK3ForConditionalGeneration with the text model under text_config). Every field the forward
// pass uses is validated here, with errors naming the field, what was expected and what was
// found. Nothing is hard-coded to K3's sizes: the layer schedule and all dimensions come from
// the file (ranks that only the tensors know, such as f_a_proj's, are read from the shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deltafin {

enum class LayerKind { kKDA, kMLA };

struct KdaConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // key and value
  int64_t conv_kernel = 0;
  float gate_lower_bound = -5.0f;
  int64_t proj_dim() const { return num_heads * head_dim; }
  // A_log is stored padded to max(head_dim, num_heads) entries; only the first num_heads are real.
  int64_t a_log_len() const { return head_dim > num_heads ? head_dim : num_heads; }
};

struct MlaConfig {
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;  // present but never rotated (NoPE)
  int64_t v_head_dim = 0;
  bool output_gate = true;
  int64_t q_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t cache_width() const { return kv_lora_rank + qk_rope_dim; }
};

struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t num_shared_experts = 0;
  int64_t intermediate = 0;  // per routed expert
  int64_t latent_dim = 0;    // routed_expert_hidden_size
  bool latent_norm = true;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  int64_t shared_intermediate() const { return num_shared_experts * intermediate; }
};

enum class ExpertFormat { kMXFP4, kBF16 };

struct ModelConfig {
  std::string path;  // the config.json read
  int64_t hidden = 0;
  int64_t num_layers = 0;
  int64_t vocab = 0;
  int64_t dense_intermediate = 0;
  int64_t first_k_dense = 0;
  int64_t attn_res_block = 0;
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
  // Whether the routed experts are declared MXFP4 (quantization_config present). The tensors
  // decide in the end: a checkpoint with a quantization_config must hold weight_packed experts.
  bool quantized_experts = false;
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
};

// Parses and validates config.json text. `path` is used in error messages. (Reading it from a
// checkpoint folder: load_config in storage/checkpoint.h.)
ModelConfig parse_config(const std::string& json_text, const std::string& path);

}  // namespace deltafin
