// Kimi-Linear's config.json (KimiLinearForCausalLM, docs/FAMILY.md KL.2) into a ModelConfig. The
// file is the text config itself (no text_config wrapper). Every field the release writes is
// read and checked here, the ones the math does not use included (so a value the engine would
// silently misread is an error naming it), and the K3-only fields are refused: a K3 config handed
// over under this architecture must not load as a Kimi-Linear model. The component choices the
// rest of the engine reads are set here: SiLU, the pre-norm residual stream, the plain MoE with
// shared experts, the softplus KDA decay with the low-rank output gate, MLA with one q_proj and
// no output gate, tensor names under `model.` / `lm_head.`.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/config_parse.h"
#include "model/field_reader.h"

namespace deltafin {

using nlohmann::json;

ModelConfig parse_kimi_linear_config(const json& root, const std::string& path) {
  std::vector<std::string> problems;
  ModelConfig c;
  c.path = path;
  c.family = Family::kKimiLinear;
  c.model_type = "kimi_linear";
  c.activation = Activation::kSiLU;
  c.residual = ResidualForm::kPreNorm;
  c.names.prefix = "";
  c.moe.flavour = MoeFlavour::kPlain;
  c.moe.latent_norm = false;
  c.kda.decay = KdaDecay::kSoftplus;
  c.kda.low_rank_output_gate = true;
  c.mla.output_gate = false;
  c.mla.latent_eps = 1e-6f;  // kv_a_layernorm: the class default (FAMILY.md KL.12 #2)
  c.attn_res_block = 0;
  FieldReader t(root, "", problems);

  t.expect_string("model_type", "kimi_linear");
  // K3-only fields: this is a K3 (or other) config under the wrong architecture.
  for (const char* k3 :
       {"text_config", "vision_config", "attn_res_block_size", "routed_expert_hidden_size",
        "latent_moe_use_norm", "activation_situ_beta", "activation_situ_linear_beta",
        "mla_use_output_gate", "quantization_config"}) {
    if (const json* v = t.find(k3); v != nullptr && !v->is_null()) {
      t.problem(fmt::format("{}: a K3 field, not part of a Kimi-Linear config (found {})", k3,
                            v->dump()));
    }
  }

  c.hidden = t.integer("hidden_size", 1);
  const size_t problems_before_layers = problems.size();
  c.num_layers = t.integer("num_hidden_layers", 1);
  const bool layers_ok = problems.size() == problems_before_layers;
  c.vocab = t.integer("vocab_size", 1);
  c.dense_intermediate = t.integer("intermediate_size", 1);
  c.first_k_dense = t.integer("first_k_dense_replace", 0);
  c.max_positions = t.integer("model_max_length", 1);
  c.rms_eps = static_cast<float>(t.number("rms_norm_eps"));
  if (!(c.rms_eps > 0)) t.problem("rms_norm_eps: expected a positive number");
  t.expect_string("hidden_act", "silu");
  c.tie_embeddings = t.boolean("tie_word_embeddings", false);
  c.bos_token_id = t.token_ids("bos_token_id", nullptr).front();
  c.eos_token_ids = t.token_ids("eos_token_id", nullptr);
  c.eos_token_id = c.eos_token_ids.front();
  if (c.eos_token_id < 0) c.eos_token_ids.clear();
  c.pad_token_id = t.token_ids("pad_token_id", nullptr).front();
  for (const int64_t id : c.eos_token_ids) {
    if (id >= c.vocab)
      t.problem(fmt::format("eos_token_id {} is outside the vocabulary ({})", id, c.vocab));
  }
  if (int64_t n = t.integer("num_nextn_predict_layers", 0, 0); n != 0) {
    t.problem(fmt::format(
        "num_nextn_predict_layers: expected 0 (Kimi-Linear has no MTP layers), found {}", n));
  }
  if (int64_t f = t.integer("moe_layer_freq", 1, 1); f != 1) {
    t.problem(fmt::format("moe_layer_freq: expected 1, found {} (not supported)", f));
  }
  if (c.first_k_dense > c.num_layers) {
    t.problem(fmt::format("first_k_dense_replace ({}) exceeds num_hidden_layers ({})",
                          c.first_k_dense, c.num_layers));
  }
  // Read and checked, unused by the math (FAMILY.md KL.2): the legacy head_dim, RoPE fields of a
  // NoPE model, metadata.
  t.integer("head_dim", 1, 0);
  if (const json* v = t.find("dtype"); v != nullptr && !v->is_null()) {
    t.expect_string("dtype", "bfloat16");
  }
  if (const json* v = t.find("torch_dtype"); v != nullptr && !v->is_null()) {
    t.expect_string("torch_dtype", "bfloat16");
  }
  t.number("rope_theta", 0.0);
  if (const json* v = t.find("rope_scaling"); v != nullptr && !v->is_null() && !v->is_object()) {
    t.problem(fmt::format("rope_scaling: expected null or an object (unused: no RoPE), found {}",
                          v->dump()));
  }
  t.number("initializer_range", 0.0);
  t.boolean("use_cache", true);
  t.string("transformers_version", std::string());

  // MLA (KL.6): one q_proj, no output gate, NoPE.
  c.mla.num_heads = t.integer("num_attention_heads", 1);
  if (const json* q = t.find("q_lora_rank"); q != nullptr && !q->is_null()) {
    t.problem(fmt::format(
        "q_lora_rank: expected null (Kimi-Linear's MLA query is one q_proj), found {}", q->dump()));
  }
  c.mla.q_lora_rank = 0;
  c.mla.kv_lora_rank = t.integer("kv_lora_rank", 1);
  c.mla.qk_nope_dim = t.integer("qk_nope_head_dim", 1);
  c.mla.qk_rope_dim = t.integer("qk_rope_head_dim", 0);
  c.mla.v_head_dim = t.integer("v_head_dim", 1);
  if (!t.boolean("mla_use_nope", false)) {
    t.problem("mla_use_nope: expected true (Kimi-Linear's MLA uses no rotary embedding)");
  }
  if (int64_t kv = t.integer("num_key_value_heads", 1, c.mla.num_heads); kv != c.mla.num_heads) {
    t.problem(fmt::format("num_key_value_heads ({}) must equal num_attention_heads ({})", kv,
                          c.mla.num_heads));
  }

  // MoE and the router (KL.8).
  c.moe.num_experts = t.integer("num_experts", 1);
  c.moe.top_k = t.integer("num_experts_per_token", 1);
  c.moe.num_shared_experts = t.integer("num_shared_experts", 0, 0);
  c.moe.intermediate = t.integer("moe_intermediate_size", 1);
  c.moe.routed_scaling_factor = static_cast<float>(t.number("routed_scaling_factor", 1.0));
  if (!(c.moe.routed_scaling_factor > 0))
    t.problem("routed_scaling_factor: expected a positive number");
  // Renormalisation applies only with more than one expert per token (the reference's rule).
  c.moe.renormalize = t.boolean("moe_renormalize", true) && c.moe.top_k > 1;
  t.expect_string("moe_router_activation_func", "sigmoid");
  t.boolean("use_grouped_topk", true);  // with one group the group step keeps everything
  if (int64_t g = t.integer("num_expert_group", 1, 1); g != 1) {
    t.problem(fmt::format(
        "num_expert_group: expected 1, found {} (group-limited routing is not implemented)", g));
  }
  if (int64_t g = t.integer("topk_group", 1, 1); g != 1) {
    t.problem(fmt::format("topk_group: expected 1, found {}", g));
  }
  if (c.moe.top_k > c.moe.num_experts) {
    t.problem(fmt::format("num_experts_per_token ({}) exceeds num_experts ({})", c.moe.top_k,
                          c.moe.num_experts));
  }

  // KDA and the layer schedule (KL.5).
  auto lin_it = root.find("linear_attn_config");
  if (lin_it == root.end() || !lin_it->is_object()) {
    t.problem("linear_attn_config: missing (expected the KDA configuration object)");
  } else {
    FieldReader l(*lin_it, "linear_attn_config.", problems);
    c.kda.num_heads = l.integer("num_heads", 1);
    c.kda.head_dim = l.integer("head_dim", 1);
    c.kda.conv_kernel = l.integer("short_conv_kernel_size", 1);
    for (const char* k3 : {"use_full_rank_gate", "gate_lower_bound"}) {
      if (const json* v = l.find(k3); v != nullptr && !v->is_null()) {
        l.problem(fmt::format(
            "linear_attn_config.{}: a K3 field (Kimi-Linear's KDA has the low-rank output gate "
            "and the unbounded softplus decay), found {}",
            k3, v->dump()));
      }
    }
    parse_layer_schedule(*lin_it, "linear_attn_config.", layers_ok, c, problems);
  }

  if (!problems.empty()) fail_config(path, c.family, problems);
  return c;
}

}  // namespace deltafin
