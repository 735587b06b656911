// The DeepSeek-V3 architecture's config.json (docs/FAMILY.md "DeepSeek-V3 and Kimi K2", §Config)
// into a ModelConfig, as four kinds of release ship it: DeepseekV3ForCausalLM flat (Kimi
// K2-Instruct / 0905 and K2-Thinking with model_type kimi_k2, DeepSeek-V3 / V3.1 with
// deepseek_v3) and KimiK25ForConditionalGeneration, whose text model is the same config nested as
// text_config with its tensors under `language_model.` (the vision tower's fields and tensors are
// read past: the text model is what runs). Every field a release writes is read and checked here,
// the ones the math does not use included, so a value the engine would misread is an error naming
// the field; K3-only fields are refused, so a K3 config under this architecture does not load.
// The component choices set here: SiLU, the pre-norm residual stream, the plain MoE with shared
// experts under `mlp.` (experts gate_proj / up_proj / down_proj), group-limited routing, MLA with
// q_a/q_b, no output gate and YaRN RoPE on the qk_rope slice, and the quantised formats the
// quantization_config declares (FP8 block-scaled trunk and experts, or INT4 routed experts).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "model/config.h"
#include "model/config_parse.h"
#include "model/field_reader.h"

namespace deltafin {

using nlohmann::json;

namespace {

// A present, non-null value of `key` must be `want` (the releases' fixed values).
void expect_value(FieldReader& r, const char* key, const json& want, const char* why) {
  const json* v = r.find(key);
  if (v != nullptr && !v->is_null() && *v != want) {
    r.problem(
        fmt::format("{}: expected {}, found {} ({})", r.name(key), want.dump(), v->dump(), why));
  }
}

// quant_method fp8 (K2-Instruct, DeepSeek-V3): E4M3 weights with 128 x 128 block scales.
void parse_fp8(FieldReader& q, ModelConfig& c) {
  q.expect_string("fmt", "e4m3");
  q.expect_string("activation_scheme", "dynamic", /*required=*/false);
  const json* bs = q.find("weight_block_size");
  if (bs == nullptr || *bs != json::array({128, 128})) {
    q.problem(fmt::format("{}: expected [128, 128] (the block the FP8 kernels take), found {}",
                          q.name("weight_block_size"), bs == nullptr ? "nothing" : bs->dump()));
  }
  // DeepSeek-V3.1 writes its scales as powers of two (ue8m0); they are still F32 multipliers.
  if (const json* f = q.find("scale_fmt"); f != nullptr && !f->is_null()) {
    q.expect_string("scale_fmt", "ue8m0");
  }
  c.fp8_trunk = true;
  c.quantized_experts = true;
  c.quantized_format = ExpertFormat::kFP8;
}

// compressed-tensors pack-quantized (K2-Thinking, K2.5): symmetric INT4 routed experts, groups of
// 32 along the input, BF16 scales. The ignore list is read but not interpreted: the stored
// tensors decide which linears are quantised, and the inventory holds them to the release layout.
void parse_int4(FieldReader& q, const json& obj, ModelConfig& c) {
  q.expect_string("format", "pack-quantized");
  if (q.find("quantization_status") != nullptr)
    q.expect_string("quantization_status", "compressed");
  expect_value(q, "kv_cache_scheme", nullptr, "the KV cache is not quantised");
  if (const json* ig = q.find("ignore"); ig != nullptr && !ig->is_null()) {
    bool ok = ig->is_array();
    for (const auto& e : ok ? *ig : json::array()) ok = ok && e.is_string();
    if (!ok) q.problem(fmt::format("{}: expected a list of strings", q.name("ignore")));
  }
  auto groups = obj.find("config_groups");
  if (groups == obj.end() || !groups->is_object() || groups->size() != 1) {
    q.problem(fmt::format("{}: expected one weight group (the INT4 scheme), found {}",
                          q.name("config_groups"),
                          groups == obj.end() ? "nothing" : groups->dump().substr(0, 120)));
  } else {
    const std::string gp = q.name("config_groups") + "." + groups->begin().key() + ".";
    static const json kNoGroup = json::object();
    const json& g = groups->begin().value();
    std::vector<std::string> sub;
    FieldReader gr(g.is_object() ? g : kNoGroup, gp, sub);  // both lvalues: no temporary
    if (!g.is_object()) gr.problem(gp.substr(0, gp.size() - 1) + ": expected an object");
    expect_value(gr, "input_activations", nullptr, "activations stay float");
    expect_value(gr, "output_activations", nullptr, "activations stay float");
    if (const json* t = gr.find("targets"); t != nullptr && *t != json::array({"Linear"}))
      gr.problem(fmt::format("{}: expected [\"Linear\"], found {}", gr.name("targets"), t->dump()));
    auto w = g.is_object() ? g.find("weights") : g.end();
    if (!g.is_object() || w == g.end() || !w->is_object()) {
      gr.problem(gp + "weights: missing (expected the INT4 weight scheme)");
    } else {
      FieldReader wr(*w, gp + "weights.", sub);
      if (wr.integer("num_bits", 1) != 4) wr.problem(wr.name("num_bits") + ": expected 4");
      wr.expect_string("type", "int");
      wr.expect_string("strategy", "group");
      if (wr.integer("group_size", 1) != 32) wr.problem(wr.name("group_size") + ": expected 32");
      if (!wr.boolean("symmetric"))
        wr.problem(wr.name("symmetric") + ": expected true (no zero points are stored)");
      if (wr.boolean("dynamic", false)) wr.problem(wr.name("dynamic") + ": expected false");
      expect_value(wr, "actorder", nullptr, "no activation ordering (no g_idx) is stored");
      expect_value(wr, "block_structure", nullptr, "groups, not blocks");
    }
    for (auto& p : sub) q.problem(p);
  }
  c.fp8_trunk = false;
  c.quantized_experts = true;
  c.quantized_format = ExpertFormat::kInt4;
}

void parse_quantization(const json& q, const std::string& where, ModelConfig& c,
                        std::vector<std::string>& problems) {
  if (!q.is_object()) {
    problems.push_back(fmt::format("{}: expected an object, found {}", where, q.dump()));
    return;
  }
  FieldReader r(q, where + ".", problems);
  const std::string method = r.string("quant_method");
  if (method == "fp8") {
    parse_fp8(r, c);
  } else if (method == "compressed-tensors") {
    parse_int4(r, q, c);
  } else if (!method.empty()) {
    r.problem(
        fmt::format("{}: expected \"fp8\" (FP8 E4M3 block-scaled) or \"compressed-tensors\" (INT4 "
                    "pack-quantized), found \"{}\" (not supported)",
                    r.name("quant_method"), method));
  }
}

void parse_rope(FieldReader& t, const json& tc, ModelConfig& c) {
  RopeConfig& rp = c.mla.rope;
  rp.enabled = true;
  rp.theta = t.number("rope_theta");
  if (!(rp.theta > 1.0) || !std::isfinite(rp.theta))
    t.problem(fmt::format("{}: expected a number > 1, found {}", t.name("rope_theta"), rp.theta));
  auto it = tc.find("rope_scaling");
  if (it == tc.end() || it->is_null()) return;  // plain RoPE
  if (!it->is_object()) {
    t.problem(fmt::format("{}: expected null or an object, found {}", t.name("rope_scaling"),
                          it->dump()));
    return;
  }
  std::vector<std::string> sub;
  FieldReader r(*it, t.name("rope_scaling") + ".", sub);
  const std::string type = r.find("type") ? r.string("type") : r.string("rope_type");
  if (type != "yarn" && type != "deepseek_yarn") {
    r.problem(fmt::format("{}: expected \"yarn\", found \"{}\" (not supported)",
                          r.name(r.find("type") ? "type" : "rope_type"), type));
  }
  rp.factor = r.number("factor");
  rp.original_max_positions = r.number("original_max_position_embeddings");
  rp.beta_fast = r.number("beta_fast", 32.0);
  rp.beta_slow = r.number("beta_slow", 1.0);
  rp.mscale = r.number("mscale", 1.0);
  rp.mscale_all_dim = r.number("mscale_all_dim", 0.0);
  if (!(rp.factor >= 1.0) || !std::isfinite(rp.factor))
    r.problem(fmt::format("{}: expected a number >= 1, found {}", r.name("factor"), rp.factor));
  if (!(rp.original_max_positions >= 1.0) || !std::isfinite(rp.original_max_positions)) {
    r.problem(fmt::format("{}: expected a number >= 1, found {}",
                          r.name("original_max_position_embeddings"), rp.original_max_positions));
  }
  const std::pair<const char*, double> positive[] = {{"beta_fast", rp.beta_fast},
                                                     {"beta_slow", rp.beta_slow}};
  for (const auto& [k, v] : positive) {
    if (!(v > 0) || !std::isfinite(v))
      r.problem(fmt::format("{}: expected a positive number, found {}", r.name(k), v));
  }
  const std::pair<const char*, double> scales[] = {{"mscale", rp.mscale},
                                                   {"mscale_all_dim", rp.mscale_all_dim}};
  for (const auto& [k, v] : scales) {
    if (!(v >= 0) || !std::isfinite(v))
      r.problem(fmt::format("{}: expected a number >= 0, found {}", r.name(k), v));
  }
  for (auto& p : sub) t.problem(p);
}

// The text model's fields (flat config, or K2.5's text_config: `p` is then "text_config.").
void parse_text(const json& tc, const std::string& p, ModelConfig& c,
                std::vector<std::string>& problems) {
  FieldReader t(tc, p, problems);
  if (const json* a = t.find("architectures"); a != nullptr && !a->is_null()) {
    if (!a->is_array() ||
        std::find(a->begin(), a->end(), json("DeepseekV3ForCausalLM")) == a->end())
      t.problem(fmt::format("{}: expected [\"DeepseekV3ForCausalLM\"], found {}",
                            t.name("architectures"), a->dump()));
  }
  c.model_type = t.string("model_type");
  if (!c.model_type.empty() && c.model_type != "kimi_k2" && c.model_type != "deepseek_v3") {
    t.problem(fmt::format("{}: expected \"kimi_k2\" or \"deepseek_v3\", found \"{}\"",
                          t.name("model_type"), c.model_type));
  }
  // K3 / Kimi-Linear fields: another family's config under this architecture.
  for (const char* k3 :
       {"attn_res_block_size", "routed_expert_hidden_size", "latent_moe_use_norm",
        "activation_situ_beta", "activation_situ_linear_beta", "mla_use_output_gate",
        "linear_attn_config", "num_experts", "num_experts_per_token", "mla_use_nope"}) {
    if (const json* v = t.find(k3); v != nullptr && !v->is_null()) {
      t.problem(
          fmt::format("{}: a K3 / Kimi-Linear field, not part of a DeepSeek-V3 config "
                      "(found {})",
                      t.name(k3), v->dump()));
    }
  }

  c.hidden = t.integer("hidden_size", 1);
  c.num_layers = t.integer("num_hidden_layers", 1);
  c.vocab = t.integer("vocab_size", 1);
  c.dense_intermediate = t.integer("intermediate_size", 1);
  c.first_k_dense = t.integer("first_k_dense_replace", 0, 0);
  c.max_positions = t.integer("max_position_embeddings", 1);
  c.rms_eps = static_cast<float>(t.number("rms_norm_eps"));
  if (!(c.rms_eps > 0)) t.problem(t.name("rms_norm_eps") + ": expected a positive number");
  t.expect_string("hidden_act", "silu");
  c.tie_embeddings = t.boolean("tie_word_embeddings", false);
  c.mtp_layers = t.integer("num_nextn_predict_layers", 0, 0);
  if (c.mtp_layers > 1) {
    t.problem(fmt::format("{}: expected 0 or 1 (the releases' one MTP layer), found {}",
                          t.name("num_nextn_predict_layers"), c.mtp_layers));
  }
  if (int64_t f = t.integer("moe_layer_freq", 1, 1); f != 1) {
    t.problem(fmt::format("{}: expected 1, found {} (not supported)", t.name("moe_layer_freq"), f));
  }
  if (c.first_k_dense > c.num_layers) {
    t.problem(fmt::format("{} ({}) exceeds num_hidden_layers ({})", t.name("first_k_dense_replace"),
                          c.first_k_dense, c.num_layers));
  }
  if (t.boolean("attention_bias", false))
    t.problem(t.name("attention_bias") + ": expected false (the releases have no biases)");
  t.number("attention_dropout", 0.0);  // training only
  t.number("aux_loss_alpha", 0.0);
  t.boolean("seq_aux", true);
  t.number("initializer_range", 0.0);
  t.integer("pretraining_tp", 1, 1);
  t.integer("ep_size", 1, 1);
  t.boolean("use_cache", true);
  t.string("transformers_version", std::string());
  for (const char* k : {"torch_dtype", "dtype"}) {
    if (const json* v = t.find(k); v != nullptr && !v->is_null()) t.expect_string(k, "bfloat16");
  }
  if (const json* v = t.find("auto_map"); v != nullptr && !v->is_null() && !v->is_object())
    t.problem(fmt::format("{}: expected an object, found {}", t.name("auto_map"), v->dump()));

  // MLA with decoupled RoPE (§MLA, §RoPE).
  auto& m = c.mla;
  m.num_heads = t.integer("num_attention_heads", 1);
  if (const json* q = t.find("q_lora_rank"); q != nullptr && q->is_null()) {
    m.q_lora_rank = 0;  // a plain q_proj
  } else {
    m.q_lora_rank = t.integer("q_lora_rank", 1);
  }
  m.kv_lora_rank = t.integer("kv_lora_rank", 1);
  m.qk_nope_dim = t.integer("qk_nope_head_dim", 1);
  m.qk_rope_dim = t.integer("qk_rope_head_dim", 2);
  m.v_head_dim = t.integer("v_head_dim", 1);
  if (m.qk_rope_dim % 2 != 0) {
    t.problem(fmt::format("{}: expected an even number (RoPE rotates pairs), found {}",
                          t.name("qk_rope_head_dim"), m.qk_rope_dim));
  }
  if (int64_t kv = t.integer("num_key_value_heads", 1, m.num_heads); kv != m.num_heads) {
    t.problem(fmt::format("{} ({}) must equal num_attention_heads ({})",
                          t.name("num_key_value_heads"), kv, m.num_heads));
  }
  parse_rope(t, tc, c);

  // The MoE and its router (§Router).
  auto& e = c.moe;
  e.num_experts = t.integer("n_routed_experts", 1);
  e.top_k = t.integer("num_experts_per_tok", 1);
  e.num_shared_experts = t.integer("n_shared_experts", 0, 0);
  e.intermediate = t.integer("moe_intermediate_size", 1);
  e.routed_scaling_factor = static_cast<float>(t.number("routed_scaling_factor", 1.0));
  if (!(e.routed_scaling_factor > 0))
    t.problem(t.name("routed_scaling_factor") + ": expected a positive number");
  // The weights renormalise over the k chosen experts when norm_topk_prob says so (and there is
  // more than one to renormalise over).
  e.renormalize = t.boolean("norm_topk_prob", false) && e.top_k > 1;
  t.expect_string("scoring_func", "sigmoid");
  t.expect_string("topk_method", "noaux_tc");
  e.num_groups = t.integer("n_group", 1, 1);
  e.topk_groups = t.integer("topk_group", 1, 1);
  if (e.num_experts % e.num_groups != 0 || (e.num_groups > 1 && e.num_experts / e.num_groups < 2)) {
    t.problem(
        fmt::format("{} ({}) must divide n_routed_experts ({}) into groups of at least 2 experts",
                    t.name("n_group"), e.num_groups, e.num_experts));
  } else if (e.topk_groups > e.num_groups) {
    t.problem(fmt::format("{} ({}) exceeds n_group ({})", t.name("topk_group"), e.topk_groups,
                          e.num_groups));
  } else if (e.top_k > e.num_experts / e.num_groups * e.topk_groups) {
    t.problem(fmt::format(
        "{} ({}) exceeds the experts of the {} groups kept (topk_group) of {} experts each",
        t.name("num_experts_per_tok"), e.top_k, e.topk_groups, e.num_experts / e.num_groups));
  }

  if (auto q = tc.find("quantization_config"); q != tc.end() && !q->is_null()) {
    parse_quantization(*q, t.name("quantization_config"), c, problems);
  }
}

void read_token_ids(FieldReader& t, const json* top, ModelConfig& c) {
  auto top_of = [&](const char* k) -> const json* {
    if (top == nullptr) return nullptr;
    auto it = top->find(k);
    return it == top->end() ? nullptr : &*it;
  };
  c.bos_token_id = t.token_ids("bos_token_id", top_of("bos_token_id")).front();
  c.eos_token_ids = t.token_ids("eos_token_id", top_of("eos_token_id"));
  c.eos_token_id = c.eos_token_ids.front();
  if (c.eos_token_id < 0) c.eos_token_ids.clear();
  c.pad_token_id = t.token_ids("pad_token_id", top_of("pad_token_id")).front();
  for (const int64_t id : c.eos_token_ids) {
    if (id >= c.vocab)
      t.problem(
          fmt::format("{} {} is outside the vocabulary ({})", t.name("eos_token_id"), id, c.vocab));
  }
}

// The family's config before its fields are read: where it came from, the components every
// DeepSeek-V3-architecture release shares, and the tensor names' prefix.
ModelConfig family_config(const std::string& path, const char* prefix) {
  ModelConfig c;
  c.path = path;
  c.names.prefix = prefix;
  c.family = Family::kDeepseekV3;
  c.activation = Activation::kSiLU;
  c.residual = ResidualForm::kPreNorm;
  c.moe.flavour = MoeFlavour::kPlain;
  c.moe.latent_norm = false;
  c.mla.output_gate = false;
  c.mla.latent_eps = 1e-6f;  // q_a / kv_a_layernorm: the modeling code's class default (§Norms)
  c.attn_res_block = 0;
  c.names.moe_block = "mlp.";
  c.names.expert_proj = {"gate_proj", "down_proj", "up_proj"};
  return c;
}

}  // namespace

ModelConfig parse_deepseek_v3_config(const json& root, const std::string& path) {
  std::vector<std::string> problems;
  ModelConfig c = family_config(path, "");
  parse_text(root, "", c, problems);
  FieldReader t(root, "", problems);
  read_token_ids(t, nullptr, c);
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), LayerKind::kMLA);
  if (!problems.empty()) fail_config(path, c.family, problems);
  return c;
}

ModelConfig parse_kimi_k25_config(const json& root, const std::string& path) {
  std::vector<std::string> problems;
  ModelConfig c = family_config(path, "language_model.");
  FieldReader top(root, "", problems);
  top.expect_string("model_type", "kimi_k25");
  auto tc_it = root.find("text_config");
  if (tc_it == root.end() || !tc_it->is_object()) {
    problems.push_back("text_config: missing (expected the text model's configuration object)");
    fail_config(path, c.family, problems);
  }
  const json& tc = *tc_it;
  parse_text(tc, "text_config.", c, problems);
  c.model_type = "kimi_k25";
  FieldReader t(tc, "text_config.", problems);
  read_token_ids(t, &root, c);
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (root.contains(k) && tc.contains(k) && root[k] != tc[k]) {
      top.problem(fmt::format("{}: the top level ({}) and text_config ({}) disagree", k,
                              root[k].dump(), tc[k].dump()));
    }
  }
  if (root.contains("tie_word_embeddings") &&
      (!root["tie_word_embeddings"].is_boolean() ||
       root["tie_word_embeddings"].get<bool>() != c.tie_embeddings)) {
    top.problem("tie_word_embeddings: the top level and text_config disagree");
  }
  // The quantisation belongs to the text model; a top-level copy must say the same.
  if (auto q = root.find("quantization_config"); q != root.end() && !q->is_null()) {
    if (!tc.contains("quantization_config")) {
      parse_quantization(*q, "quantization_config", c, problems);
    } else if (*q != tc["quantization_config"]) {
      top.problem("quantization_config: the top level and text_config disagree");
    }
  }
  // The vision tower and the media prompt are another component's; read and checked for shape.
  if (const json* v = top.find("vision_config"); v != nullptr && !v->is_null() && !v->is_object())
    top.problem(fmt::format("vision_config: expected an object, found {}", v->dump()));
  top.integer("media_placeholder_token_id", 0, 0);
  top.integer("ignore_index", INT64_MIN / 2, -100);
  top.boolean("use_unified_vision_chunk", false);
  top.string("video_placeholder", std::string());
  top.string("transformers_version", std::string());
  for (const char* k : {"torch_dtype", "dtype"}) {
    if (const json* v = top.find(k); v != nullptr && !v->is_null())
      top.expect_string(k, "bfloat16");
  }
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), LayerKind::kMLA);
  if (!problems.empty()) fail_config(path, c.family, problems);
  return c;
}

}  // namespace deltafin
