// The release's configuration files, trimmed to the fields the parser reads (docs/MODEL.md §1
// for K3; docs/FAMILY.md for Kimi-Linear). The lists of layers are the releases' own: K3's MLA
// layers are every fourth and the last, as are Kimi-Linear's.
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

}  // namespace

const std::vector<ReleasedModel>& released_models() {
  static const std::vector<ReleasedModel> models = {
      {"kimi-k3", "Kimi K3", "moonshotai/Kimi-K3", kK3Config, 4ull << 30},
      {"kimi-linear", "Kimi-Linear 48B-A3B", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
       kKimiLinearConfig, 5ull << 30},
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

}  // namespace deltafin
