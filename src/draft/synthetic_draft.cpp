// Synthetic draft folders (see synthetic_draft.h). The config is written with the release's
// field names and parsed back before any tensor is written, so a generated folder is by
// construction one this engine loads; tensors go through the engine's random checkpoint writer.
#include "draft/synthetic_draft.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deltafin {

using ojson = nlohmann::ordered_json;

SyntheticDraftSpec synthetic_draft_preset(const std::string& kind) {
  SyntheticDraftSpec s;
  if (kind == "eagle3.1") return s;
  if (kind == "eagle3") {
    s.v31 = false;
    return s;
  }
  if (kind == "dspark") {
    s.kind = DraftKind::kDSpark;
    return s;
  }
  fail_arg("--drafter {}: expected eagle3.1, eagle3 or dspark", kind);
}

std::string synthetic_draft_config_json(const SyntheticDraftSpec& s, const ModelConfig& t) {
  std::vector<int> taps = s.taps;
  if (taps.empty()) {
    const int n = static_cast<int>(t.num_layers);
    taps = {std::min(1, n - 1), n / 2, std::max(0, n - 2)};
    taps.erase(std::unique(taps.begin(), taps.end()), taps.end());
  }
  const MlaConfig& m = t.mla;
  ojson j;
  const bool eagle = s.kind == DraftKind::kEagle3;
  j["architectures"] = {eagle ? "Eagle3DeepseekV2ForCausalLM" : "K3DSparkModel"};
  j["model_type"] = eagle ? "kimi_k2" : "k3_dspark";
  j["hidden_size"] = t.hidden;
  j["intermediate_size"] = 2 * t.hidden;
  j["num_hidden_layers"] = eagle ? 1 : s.layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = m.num_heads;
  j["q_lora_rank"] = m.q_lora_rank;
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_nope_dim;
  j["qk_rope_head_dim"] = m.qk_rope_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["mla_use_nope"] = eagle;  // as released: wrong for inference, ignored (DRAFTERS.md §1.1)
  j["rms_norm_eps"] = 1e-5;
  j["vocab_size"] = t.vocab;
  j["draft_vocab_size"] = t.vocab;
  j["torch_dtype"] = "bfloat16";
  j["rope_theta"] = 50000.0;
  j["max_position_embeddings"] = t.max_positions;
  const ojson yarn = {{"factor", 32.0},  {"original_max_position_embeddings", 32768},
                      {"beta_fast", 32}, {"beta_slow", 1},
                      {"mscale", 1.0},   {"mscale_all_dim", 1.0}};
  if (eagle) {
    j["hidden_act"] = "silu";
    j["rope_scaling"] = yarn;
    j["rope_scaling"]["type"] = "yarn";
    j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", taps},
                         {"use_aux_hidden_state", true},
                         {"use_input_layernorm_in_first_layer", true},
                         {"use_last_layernorm", true},
                         {"use_mtp_layernorm", false}};
    if (s.v31) {
      j["fc_norm"] = true;
      j["norm_output"] = true;
    }
  } else {
    j["mla_use_output_gate"] = false;
    j["num_target_layers"] = taps.size();
    j["target_hidden_size"] = t.hidden;
    j["target_num_hidden_layers"] = t.num_layers;
    j["target_layer_ids"] = taps;
    j["mask_token_id"] = t.vocab - 3;
    j["markov_rank"] = std::min<int64_t>(256, t.hidden / 16);
    j["markov_head_type"] = "vanilla";
    j["enable_confidence_head"] = true;
    j["confidence_head_with_markov"] = true;
    j["rope_parameters"] = yarn;
    j["rope_parameters"]["rope_type"] = "yarn";
    j["rope_parameters"]["rope_theta"] = 50000.0;
    if (s.stream == TapStream::kMixture) {
      j["aux_hidden_stream"] = "attn_res";
      j["fc_norm"] = true;
    }
  }
  return j.dump(2) + "\n";
}

std::vector<ExpectedTensor> draft_tensors(const DraftModelConfig& c) {
  const int64_t H = c.hidden, n = static_cast<int64_t>(c.taps.layers.size());
  const MlaConfig& m = c.mla;
  std::vector<ExpectedTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back({name, std::move(shape), DType::kBF16});
  };
  const bool eagle = c.kind == DraftKind::kEagle3;
  const int64_t in = eagle ? 2 * H : H;
  add(eagle ? "fc.weight" : "context_proj.weight", {H, n * H});
  if (c.fc_norm) {
    for (int64_t i = 0; i < n; ++i) add(fmt::format("fc_norm.{}.weight", i), {H});
  }
  if (!eagle) add("context_norm.weight", {H});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    if (eagle) add(p + "hidden_norm.weight", {H});
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "self_attn.q_a_proj.weight", {m.q_lora_rank, in});
    add(p + "self_attn.q_a_layernorm.weight", {m.q_lora_rank});
    add(p + "self_attn.q_b_proj.weight", {m.num_heads * m.q_head_dim(), m.q_lora_rank});
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {m.cache_width(), in});
    add(p + "self_attn.kv_a_layernorm.weight", {m.kv_lora_rank});
    add(p + "self_attn.kv_b_proj.weight",
        {m.num_heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank});
    add(p + "self_attn.o_proj.weight", {H, m.num_heads * m.v_head_dim});
    add(p + "mlp.gate_proj.weight", {c.intermediate, H});
    add(p + "mlp.up_proj.weight", {c.intermediate, H});
    add(p + "mlp.down_proj.weight", {H, c.intermediate});
  }
  if (eagle) {
    add("norm.weight", {H});
    add("lm_head.weight", {c.vocab, H});
  } else {
    add("final_norm.weight", {H});
    add("markov_head.markov_w1.weight", {c.vocab, c.markov_rank});
    add("markov_head.markov_w2.weight", {c.vocab, c.markov_rank});
    if (c.confidence_head) {
      add("confidence_head.proj.weight", {1, H + (c.confidence_with_markov ? c.markov_rank : 0)});
      add("confidence_head.proj.bias", {1});
    }
  }
  add("embed_tokens.weight", {c.vocab, H});  // a copy of the target's in the release; unused
  return out;
}

MakeModelResult make_draft_model(const std::string& out_dir, const SyntheticDraftSpec& s,
                                 const ModelConfig& target) {
  const std::string text = synthetic_draft_config_json(s, target);
  const DraftModelConfig c = parse_draft_config(text, "config.json (generated)");
  check_draft_matches(c, target);
  return write_random_checkpoint(out_dir, text, draft_tensors(c), s.seed);
}

}  // namespace deltafin
