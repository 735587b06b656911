// The K3 parser, the routing on `architectures`, and what every family shares (the layer
// schedule of linear_attn_config). Kimi-Linear's parser is config_kimi_linear.cpp, DeepSeek-V3 /
// Kimi K2's config_deepseek_v3.cpp.
#include "model/config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "model/config_parse.h"
#include "model/field_reader.h"

namespace deltafin {

using nlohmann::json;

namespace {

void check_quantization(const json& q, std::vector<std::string>& problems) {
  const std::string p = "text_config.quantization_config.";
  auto want = [&](const json& obj, const char* key, const json& expected,
                  const std::string& where) {
    auto it = obj.find(key);
    if (it == obj.end()) {
      problems.push_back(fmt::format("{}{}: missing (expected {})", where, key, expected.dump()));
    } else if (*it != expected) {
      problems.push_back(
          fmt::format("{}{}: expected {}, found {} (only MXFP4 compressed-tensors "
                      "experts are supported)",
                      where, key, expected.dump(), it->dump()));
    }
  };
  if (!q.is_object()) {
    problems.push_back(p.substr(0, p.size() - 1) + ": expected an object, found " + q.dump());
    return;
  }
  want(q, "quant_method", "compressed-tensors", p);
  want(q, "format", "mxfp4-pack-quantized", p);
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    problems.push_back(p + "config_groups: missing (expected one MXFP4 weight group)");
    return;
  }
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    std::string gp = p + "config_groups." + it.key() + ".";
    const json& g = it.value();
    if (!g.is_object()) {
      problems.push_back(gp + ": expected an object");
      continue;
    }
    auto w = g.find("weights");
    if (w == g.end() || !w->is_object()) {
      problems.push_back(gp + "weights: missing (expected the MXFP4 weight scheme)");
      continue;
    }
    std::string wp = gp + "weights.";
    want(*w, "num_bits", 4, wp);
    want(*w, "type", "float", wp);
    want(*w, "group_size", 32, wp);
    want(*w, "strategy", "group", wp);
    want(*w, "symmetric", true, wp);
    auto act = g.find("input_activations");
    if (act != g.end() && !act->is_null()) {
      problems.push_back(gp +
                         "input_activations: expected null (activation quantization is not "
                         "part of the released checkpoint), found " +
                         act->dump());
    }
  }
}

}  // namespace

[[noreturn]] void fail_config(const std::string& path, Family family,
                              const std::vector<std::string>& problems) {
  constexpr size_t kShown = 20;
  std::vector<std::string> shown(problems.begin(),
                                 problems.begin() + std::min(problems.size(), kShown));
  if (problems.size() > kShown)
    shown.push_back(fmt::format("... and {} more problems", problems.size() - kShown));
  fail("{}: invalid {} config:\n  {}", path, family_name(family), fmt::join(shown, "\n  "));
}

void parse_layer_schedule(const nlohmann::json& lin, const std::string& prefix, bool layers_ok,
                          ModelConfig& c, std::vector<std::string>& problems) {
  FieldReader l(lin, prefix, problems);
  auto full = layers_ok ? l.int_list("full_attn_layers") : std::vector<int64_t>{};
  auto kda = layers_ok ? l.int_list("kda_layers") : std::vector<int64_t>{};
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), LayerKind::kKDA);
  std::vector<int> seen(static_cast<size_t>(c.num_layers), 0);
  auto mark = [&](const std::vector<int64_t>& list, LayerKind kind, const char* key) {
    for (int64_t one_based : list) {
      if (one_based < 1 || one_based > c.num_layers) {
        l.problem(
            fmt::format("{}{}: layer {} is outside 1..{}", prefix, key, one_based, c.num_layers));
        continue;
      }
      c.layer_kinds[one_based - 1] = kind;
      seen[one_based - 1]++;
    }
  };
  mark(full, LayerKind::kMLA, "full_attn_layers");
  mark(kda, LayerKind::kKDA, "kda_layers");
  for (int64_t i = 0; i < c.num_layers && layers_ok; ++i) {
    if (seen[i] != 1) {
      l.problem(fmt::format(
          "{}: layer {} (1-based) must appear in exactly one of full_attn_layers and kda_layers, "
          "found {} times",
          prefix.substr(0, prefix.size() - 1), i + 1, seen[i]));
    }
  }
}

constexpr EnumName<Family> kFamilyNames[] = {
    {Family::kK3, "K3"},
    {Family::kKimiLinear, "Kimi-Linear"},
    {Family::kDeepseekV3, "DeepSeek-V3 / Kimi K2"},
};

const char* family_name(Family f) {
  return name_of(kFamilyNames, f);
}

constexpr EnumName<ExpertFormat> kExpertFormatNames[] = {
    {ExpertFormat::kMXFP4, "MXFP4"},
    {ExpertFormat::kBF16, "BF16"},
    {ExpertFormat::kFP8, "FP8 E4M3 (128x128 block scales)"},
    {ExpertFormat::kInt4, "INT4 (pack-quantized, group 32)"},
};

const char* expert_format_name(ExpertFormat f) {
  return name_of(kExpertFormatNames, f);
}

std::string TensorNames::layer(int64_t i) const {
  return fmt::format("{}model.layers.{}.", prefix, i);
}

std::string TensorNames::expert(int64_t i, int64_t e) const {
  return fmt::format("{}experts.{}.", moe(i), e);
}

int64_t ModelConfig::num_kda_layers() const {
  return std::count(layer_kinds.begin(), layer_kinds.end(), LayerKind::kKDA);
}
int64_t ModelConfig::num_mla_layers() const {
  return std::count(layer_kinds.begin(), layer_kinds.end(), LayerKind::kMLA);
}

namespace {

// K3: KimiK3ForConditionalGeneration, the text model under text_config (docs/MODEL.md §2.1).
ModelConfig parse_k3_config(const json& root, const std::string& path) {
  std::vector<std::string> problems;
  ModelConfig c;
  c.path = path;
  c.family = Family::kK3;
  c.model_type = "kimi_k3";
  c.activation = Activation::kSiTU;
  c.residual = ResidualForm::kAttnRes;
  c.names.prefix = "language_model.";
  c.moe.flavour = MoeFlavour::kLatent;
  c.kda.decay = KdaDecay::kBoundedSigmoid;

  auto tc_it = root.find("text_config");
  if (tc_it == root.end() || !tc_it->is_object()) {
    problems.push_back("text_config: missing (expected the text model's configuration object)");
    fail_config(path, c.family, problems);
  }
  const json& tc = *tc_it;
  FieldReader t(tc, "text_config.", problems);

  c.hidden = t.integer("hidden_size", 1);
  const size_t problems_before_layers = problems.size();
  c.num_layers = t.integer("num_hidden_layers", 1);
  // With no valid layer count the layer schedule cannot be checked: one line, not one per layer.
  const bool layers_ok = problems.size() == problems_before_layers;
  c.vocab = t.integer("vocab_size", 1);
  c.dense_intermediate = t.integer("intermediate_size", 1);
  c.first_k_dense = t.integer("first_k_dense_replace", 0);
  c.attn_res_block = t.integer("attn_res_block_size", 1);
  c.max_positions = t.integer("max_position_embeddings", 1);
  c.rms_eps = static_cast<float>(t.number("rms_norm_eps"));
  if (!(c.rms_eps > 0)) t.problem("text_config.rms_norm_eps: expected a positive number");
  t.expect_string("hidden_act", "situ");
  c.situ_beta = static_cast<float>(t.number("activation_situ_beta"));
  c.situ_linear_beta = static_cast<float>(t.number("activation_situ_linear_beta"));
  if (!(c.situ_beta > 0)) t.problem("text_config.activation_situ_beta: expected a positive number");
  if (!(c.situ_linear_beta > 0))
    t.problem("text_config.activation_situ_linear_beta: expected a positive number");
  c.tie_embeddings = t.boolean("tie_word_embeddings", false);
  if (root.contains("tie_word_embeddings") && root["tie_word_embeddings"].is_boolean() &&
      root["tie_word_embeddings"].get<bool>() != c.tie_embeddings) {
    t.problem("tie_word_embeddings: the top level and text_config disagree");
  }
  auto top = [&](const char* k) { return root.contains(k) ? &root[k] : nullptr; };
  c.bos_token_id = t.token_ids("bos_token_id", top("bos_token_id")).front();
  c.eos_token_ids = t.token_ids("eos_token_id", top("eos_token_id"));
  c.eos_token_id = c.eos_token_ids.front();
  if (c.eos_token_id < 0) c.eos_token_ids.clear();
  c.pad_token_id = t.token_ids("pad_token_id", top("pad_token_id")).front();
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (root.contains(k) && tc.contains(k) && root[k] != tc[k]) {
      t.problem(fmt::format("{}: the top level ({}) and text_config ({}) disagree", k,
                            root[k].dump(), tc[k].dump()));
    }
  }
  for (const int64_t id : c.eos_token_ids) {
    if (id >= c.vocab)
      t.problem(
          fmt::format("text_config.eos_token_id {} is outside the vocabulary ({})", id, c.vocab));
  }
  if (int64_t n = t.integer("num_nextn_predict_layers", 0, 0); n != 0) {
    t.problem(fmt::format(
        "text_config.num_nextn_predict_layers: expected 0 (K3 has no MTP head), found {}", n));
  }
  if (int64_t f = t.integer("moe_layer_freq", 1, 1); f != 1) {
    t.problem(fmt::format("text_config.moe_layer_freq: expected 1, found {} (not supported)", f));
  }

  // MLA
  c.mla.num_heads = t.integer("num_attention_heads", 1);
  c.mla.q_lora_rank = t.integer("q_lora_rank", 1);
  c.mla.kv_lora_rank = t.integer("kv_lora_rank", 1);
  c.mla.qk_nope_dim = t.integer("qk_nope_head_dim", 1);
  c.mla.qk_rope_dim = t.integer("qk_rope_head_dim", 0);
  c.mla.v_head_dim = t.integer("v_head_dim", 1);
  if (!t.boolean("mla_use_nope", false)) {
    t.problem(
        "text_config.mla_use_nope: expected true (K3's MLA uses no rotary embedding; RoPE is not "
        "implemented)");
  }
  c.mla.output_gate = t.boolean("mla_use_output_gate", false);

  // MoE
  c.moe.num_experts = t.integer("num_experts", 1);
  c.moe.top_k = t.integer("num_experts_per_token", 1);
  c.moe.num_shared_experts = t.integer("num_shared_experts", 0, 0);
  c.moe.intermediate = t.integer("moe_intermediate_size", 1);
  c.moe.latent_dim = t.integer("routed_expert_hidden_size", 1);
  c.moe.latent_norm = t.boolean("latent_moe_use_norm", true);
  c.moe.renormalize = t.boolean("moe_renormalize", true);
  c.moe.routed_scaling_factor = static_cast<float>(t.number("routed_scaling_factor", 1.0));
  t.expect_string("moe_router_activation_func", "sigmoid");
  t.expect_string("topk_method", "noaux_tc");
  if (int64_t g = t.integer("num_expert_group", 1, 1); g != 1) {
    t.problem(
        fmt::format("text_config.num_expert_group: expected 1, found {} (group-limited routing is "
                    "not implemented)",
                    g));
  }
  if (int64_t g = t.integer("topk_group", 1, 1); g != 1) {
    t.problem(fmt::format("text_config.topk_group: expected 1, found {}", g));
  }
  if (c.moe.top_k > c.moe.num_experts) {
    t.problem(fmt::format("text_config.num_experts_per_token ({}) exceeds num_experts ({})",
                          c.moe.top_k, c.moe.num_experts));
  }
  if (c.moe.latent_dim % 32 != 0 || c.moe.intermediate % 32 != 0) {
    t.problem(
        fmt::format("text_config: routed_expert_hidden_size ({}) and moe_intermediate_size ({}) "
                    "must be multiples of 32 (MXFP4 groups)",
                    c.moe.latent_dim, c.moe.intermediate));
  }
  if (c.first_k_dense > c.num_layers) {
    t.problem(fmt::format("text_config.first_k_dense_replace ({}) exceeds num_hidden_layers ({})",
                          c.first_k_dense, c.num_layers));
  }

  // KDA and the layer schedule
  auto lin_it = tc.find("linear_attn_config");
  if (lin_it == tc.end() || !lin_it->is_object()) {
    t.problem("text_config.linear_attn_config: missing (expected the KDA configuration object)");
  } else {
    FieldReader l(*lin_it, "text_config.linear_attn_config.", problems);
    c.kda.num_heads = l.integer("num_heads", 1);
    c.kda.head_dim = l.integer("head_dim", 1);
    c.kda.conv_kernel = l.integer("short_conv_kernel_size", 1);
    c.kda.gate_lower_bound = static_cast<float>(l.number("gate_lower_bound"));
    if (!(c.kda.gate_lower_bound < 0))
      l.problem(
          "text_config.linear_attn_config.gate_lower_bound: expected a negative number (the "
          "sigmoid decay form)");
    if (!l.boolean("use_full_rank_gate", false)) {
      l.problem(
          "text_config.linear_attn_config.use_full_rank_gate: expected true (K3's single g_proj "
          "output gate)");
    }
    parse_layer_schedule(*lin_it, "text_config.linear_attn_config.", layers_ok, c, problems);
  }

  if (auto v = root.find("vision_config"); v != root.end()) c.vision_config_json = v->dump();

  if (auto q = tc.find("quantization_config"); q != tc.end() && !q->is_null()) {
    check_quantization(*q, problems);
    c.quantized_experts = true;
  }

  if (!problems.empty()) {
    fail_config(path, c.family, problems);
  }
  return c;
}

}  // namespace

ModelConfig parse_config(const std::string& json_text, const std::string& path) {
  const json root = parse_json(json_text, path);
  if (!root.is_object()) fail("{}: expected a JSON object at the top level", path);
  // Route on the top-level architecture; each family's parser checks the rest.
  std::vector<std::string> archs;
  if (auto a = root.find("architectures"); a != root.end() && a->is_array()) {
    for (const auto& s : *a) {
      if (s.is_string()) archs.push_back(s.get<std::string>());
    }
  }
  for (const auto& a : archs) {
    if (a == "KimiK3ForConditionalGeneration") return parse_k3_config(root, path);
    if (a == "KimiLinearForCausalLM") return parse_kimi_linear_config(root, path);
    if (a == "DeepseekV3ForCausalLM") return parse_deepseek_v3_config(root, path);
    if (a == "KimiK25ForConditionalGeneration") return parse_kimi_k25_config(root, path);
  }
  fail(
      "{}: architectures: expected [\"KimiK3ForConditionalGeneration\"] (Kimi K3), "
      "[\"KimiLinearForCausalLM\"] (Kimi-Linear), [\"DeepseekV3ForCausalLM\"] (Kimi K2, "
      "DeepSeek-V3) or [\"KimiK25ForConditionalGeneration\"] (Kimi K2.5), found {} (this "
      "architecture is not supported)",
      path, root.contains("architectures") ? root["architectures"].dump() : "nothing");
}

}  // namespace deltafin
