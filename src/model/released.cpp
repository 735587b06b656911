// The release's configuration files, trimmed to the fields the parser reads (docs/MODEL.md §1
// for K3; docs/FAMILY.md for Kimi-Linear, and for the DeepSeek-V3 architecture as Kimi K2,
// K2-Thinking, K2.5 and DeepSeek-V3 ship it, whose shared fields are written once). The lists of
// layers are the releases' own: K3's MLA layers are every fourth and the last, as are
// Kimi-Linear's.
#include "model/released.h"

#include <fmt/format.h>

#include "core/error.h"

namespace deltafin {

namespace {

constexpr const char* kK3Config = R"({
 "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
 "dtype": "bfloat16", "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
 "tie_word_embeddings": false,
 "vision_config": {"model_type": "moonvit3d"},
 "text_config": {
  "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
  "hidden_size": 7168, "num_hidden_layers": 93, "vocab_size": 163840,
  "num_attention_heads": 96, "num_key_value_heads": 96, "rms_norm_eps": 1e-5,
  "intermediate_size": 33792, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
  "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584, "latent_moe_use_norm": true,
  "routed_scaling_factor": 1.0, "moe_renormalize": true, "moe_router_activation_func": "sigmoid",
  "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "use_grouped_topk": true,
  "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
  "attn_res_block_size": 12,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "mla_use_nope": true, "mla_use_output_gate": true,
  "linear_attn_config": {
   "full_attn_layers": [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72,
                        76, 80, 84, 88, 92, 93],
   "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26, 27,
                  29, 30, 31, 33, 34, 35, 37, 38, 39, 41, 42, 43, 45, 46, 47, 49, 50, 51, 53, 54,
                  55, 57, 58, 59, 61, 62, 63, 65, 66, 67, 69, 70, 71, 73, 74, 75, 77, 78, 79, 81,
                  82, 83, 85, 86, 87, 89, 90, 91],
   "head_dim": 128, "num_heads": 96, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
   "use_full_rank_gate": true},
  "num_nextn_predict_layers": 0, "use_cache": true, "tie_word_embeddings": false,
  "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
  "max_position_embeddings": 1048576, "dtype": "bfloat16",
  "quantization_config": {
   "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
   "quantization_status": "compressed",
   "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
    "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                "symmetric": true, "dynamic": false, "observer": "minmax",
                "scale_dtype": "torch.uint8"},
    "input_activations": null, "output_activations": null}},
   "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
              "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]}}
})";

constexpr const char* kKimiLinearConfig = R"({
 "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
 "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
 "hidden_size": 2304, "num_hidden_layers": 27, "vocab_size": 163840, "head_dim": 72,
 "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-5,
 "hidden_act": "silu", "initializer_range": 0.02, "intermediate_size": 9216,
 "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_experts": 256,
 "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
 "moe_renormalize": true, "moe_router_activation_func": "sigmoid", "num_expert_group": 1,
 "topk_group": 1, "use_grouped_topk": true, "routed_scaling_factor": 2.446,
 "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
 "v_head_dim": 128, "mla_use_nope": true, "rope_scaling": null, "rope_theta": 10000.0,
 "linear_attn_config": {
  "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
  "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
  "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4},
 "model_max_length": 1048576, "num_nextn_predict_layers": 0, "tie_word_embeddings": false,
 "use_cache": true
})";

// Kimi K2-Instruct-0905 (docs/FAMILY.md "DeepSeek-V3 and Kimi K2", §Config): the DeepSeek-V3
// architecture, FP8 E4M3 linears with 128x128 block scales. K2-Thinking is the same text model
// with BF16 linears and INT4 routed experts; K2.5 nests it as text_config; DeepSeek-V3 differs in
// heads, experts and groups, RoPE, vocabulary and its MTP layer.
constexpr const char* kK2Common =
    R"("attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 262144, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "pretraining_tp": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 163840,
  "bos_token_id": 163584, "eos_token_id": 163585)";

constexpr const char* kK2Int4 = R"("quantization_config": {
   "quant_method": "compressed-tensors", "format": "pack-quantized",
   "quantization_status": "compressed", "kv_cache_scheme": null,
   "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
    "output_activations": null,
    "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                "group_size": 32, "dynamic": false, "actorder": null, "block_structure": null,
                "observer": "minmax"}}},
   "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
              "re:.*mlp\\.(gate|up|gate_up|down)_proj.*")";

constexpr const char* kK2Fp8 = R"("quantization_config": {"activation_scheme": "dynamic",
  "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})";

constexpr const char* kK2Head = R"({"architectures": ["DeepseekV3ForCausalLM"],
  "model_type": "kimi_k2", "rms_norm_eps": 1e-06, )";

// K2.5: rms_norm_eps 1e-5 in text_config (docs/FAMILY.md §Config, [U]); the vision tower's
// fields are not the text model's and are left out.
constexpr const char* kK25Head = R"({
 "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
 "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
 "media_placeholder_token_id": 163605, "tie_word_embeddings": false,
 "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
  "rms_norm_eps": 1e-05, )";

constexpr const char* kDeepseekV3Config = R"({
 "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
 "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "ep_size": 1,
 "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
 "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
 "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
 "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
 "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
 "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                         "weight_block_size": [128, 128]},
 "rms_norm_eps": 1e-06,
 "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                  "type": "yarn"},
 "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
 "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280,
 "bos_token_id": 0, "eos_token_id": 1
})";

}  // namespace

const std::vector<ReleasedModel>& released_models() {
  static const std::vector<ReleasedModel> models = {
      {"kimi-k3", "Kimi K3", "moonshotai/Kimi-K3", kK3Config, 4ull << 30},
      {"kimi-linear", "Kimi-Linear 48B-A3B", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
       kKimiLinearConfig, 5ull << 30},
      {"kimi-k2", "Kimi K2 Instruct 0905", "moonshotai/Kimi-K2-Instruct-0905",
       std::string(kK2Head) + kK2Common + ",\n " + kK2Fp8 + "}", 16ull << 30},
      {"kimi-k2-thinking", "Kimi K2 Thinking", "moonshotai/Kimi-K2-Thinking",
       std::string(kK2Head) + kK2Common + ",\n " + kK2Int4 + "]}}", 10ull << 30},
      {"kimi-k2.5", "Kimi K2.5 (text model)", "moonshotai/Kimi-K2.5",
       std::string(kK25Head) + kK2Common + ",\n " + kK2Int4 +
           R"(, "re:.*vision_tower.*", "re:.*mm_projector.*"]}}})",
       10ull << 30},
      {"deepseek-v3", "DeepSeek-V3", "deepseek-ai/DeepSeek-V3", kDeepseekV3Config, 4ull << 30},
  };
  return models;
}

const ReleasedModel& released_model(const std::string& name) {
  std::string known;
  for (const ReleasedModel& m : released_models()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  fail_arg("unknown released model \"{}\" (expected one of: {})", name, known);
}

std::string release_name_of(const ModelConfig& c) {
  switch (c.family) {
    case Family::kK3:
      return "kimi-k3";
    case Family::kKimiLinear:
      return "kimi-linear";
    case Family::kDeepseekV3:
      if (c.model_type == "deepseek_v3") return "deepseek-v3";
      if (c.model_type == "kimi_k25") return "kimi-k2.5";
      return c.expert_format() == ExpertFormat::kInt4 ? "kimi-k2-thinking" : "kimi-k2";
  }
  return "kimi-k3";
}

}  // namespace deltafin
