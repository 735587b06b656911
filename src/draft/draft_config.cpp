// Draft config parsing (see draft_config.h). Field names are the releases': EAGLE keeps YaRN
// under `rope_scaling` and its taps under `eagle_config.eagle_aux_hidden_state_layer_ids`, with
// the 3.1 switches `fc_norm` / `norm_output` at the top level (absent = 3.0); DSpark keeps YaRN
// under `rope_parameters`, its taps in `target_layer_ids` and the stream in `aux_hidden_stream`
// (absent = the raw prefix, Inferact's). `mla_use_nope` is read and ignored: every K3 draft
// rotates (docs/DRAFT-MODELS.md §3.1).
#include "draft/draft_config.h"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "model/field_reader.h"

namespace deltafin {

using nlohmann::json;

constexpr EnumName<DraftKind> kDraftKindNames[] = {
    {DraftKind::kEagle3, "eagle3"}, {DraftKind::kDSpark, "dspark"}, {DraftKind::kMtp, "mtp"}};

const char* draft_kind_name(DraftKind k) {
  return name_of(kDraftKindNames, k);
}

namespace {

// The kind from `architectures` (as released: one name) or, without that field, from
// `model_type` / `eagle_config`. A present `architectures` must name a known draft: a config
// whose class is ["Foo"], [] or 5 is not a draft this engine knows, whatever else it holds.
DraftKind detect_kind(const json& j, const std::string& path) {
  std::string type;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string())
    type = it->get<std::string>();
  std::string arch = "absent";
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    const bool one_name = it->is_array() && it->size() == 1 && (*it)[0].is_string();
    const std::string name = one_name ? (*it)[0].get<std::string>() : "";
    if (name.rfind("Eagle3", 0) == 0) return DraftKind::kEagle3;
    if (name == "K3DSparkModel") return DraftKind::kDSpark;
    arch = one_name ? "\"" + name + "\"" : it->dump().substr(0, 80);
  } else if (j.contains("eagle_config")) {
    return DraftKind::kEagle3;
  } else if (type == "k3_dspark") {
    return DraftKind::kDSpark;
  }
  fail(
      "{}: unknown drafter kind (architectures {}, model_type {}); expected an EAGLE-3 draft "
      "(architectures [\"Eagle3DeepseekV2ForCausalLM\"], with eagle_config) or a DSpark draft "
      "([\"K3DSparkModel\"])",
      path, arch, type.empty() ? "absent" : "\"" + type + "\"");
}

// A number that must be finite and > 0 (an epsilon, a RoPE base): a negative epsilon or a zero
// base loads and then drafts NaN.
double positive(FieldReader& r, const char* key, std::optional<double> fallback) {
  const double v = r.number(key, fallback);
  if (r.find(key) != nullptr && r.find(key)->is_number() && !(std::isfinite(v) && v > 0))
    r.problem(fmt::format("{}: expected a number > 0, found {}", r.name(key), r.find(key)->dump()));
  return v;
}

void read_yarn(FieldReader& top, const json& j, const char* key, YarnConfig& y) {
  y.theta = positive(top, "rope_theta", 10000.0);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_object()) {
    top.problem(fmt::format("{}: expected an object, found {}", top.name(key), it->dump()));
    return;
  }
  std::vector<std::string> sub;
  FieldReader r(*it, top.name(key) + ".", sub);
  const std::string type = r.find("type") ? r.string("type") : r.string("rope_type", "yarn");
  if (type != "yarn" && type != "deepseek_yarn") {
    r.problem(fmt::format("{}: \"{}\" is not supported (expected yarn)",
                          r.name(r.find("type") ? "type" : "rope_type"), type));
  }
  y.factor = r.number("factor");
  y.original_max_positions = r.number("original_max_position_embeddings");
  y.beta_fast = r.number("beta_fast", 32.0);
  y.beta_slow = r.number("beta_slow", 1.0);
  y.mscale = r.number("mscale", 1.0);
  y.mscale_all_dim = r.number("mscale_all_dim", 0.0);
  if (r.find("rope_theta")) y.theta = positive(r, "rope_theta", {});
  if (!(y.factor >= 1.0) || !std::isfinite(y.factor))
    r.problem(fmt::format("{}: expected >= 1, found {}", r.name("factor"), y.factor));
  if (y.factor > 1.0 && !(y.original_max_positions > 0))
    r.problem(fmt::format("{}: expected a number > 0 (YaRN scales from it), found {}",
                          r.name("original_max_position_embeddings"), y.original_max_positions));
  for (auto& p : sub) top.problem(p);
}

// The tapped target layers, 0-based. Read at full width and range-checked here (a layer number
// that does not fit an int is an error, not a wrapped value); the target's own layer count is
// checked when the draft meets its target (check_draft_matches).
std::vector<int> tap_layers(FieldReader& r, const char* key) {
  std::vector<int> out;
  const int64_t most = config_field_bound("num_hidden_layers") - 1;
  const std::vector<int64_t> layers = r.int_list(key, "a list of 0-based target layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] > most) {
      r.problem(
          fmt::format("{}: layer {} is out of range (expected 0-based target layers, 0 to {})",
                      r.name(key), (*r.find(key))[i].dump(), most));
      return {};
    }
    out.push_back(static_cast<int>(layers[i]));
  }
  if (out.empty() && r.find(key) != nullptr && r.find(key)->is_array() && r.find(key)->empty())
    r.problem(
        fmt::format("{}: the list is empty (expected the tapped target layers)", r.name(key)));
  return out;
}

}  // namespace

DraftModelConfig parse_draft_config(const std::string& text, const std::string& path) {
  json j;
  check_json_depth(text, kMaxJsonDepth, path);
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse errors and numbers beyond a double
    fail("{}: not valid JSON: {}", path, json_error_text(e));
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  DraftModelConfig d;
  d.path = path;
  d.kind = detect_kind(j, path);
  std::vector<std::string> problems;
  FieldReader r(j, "", problems);
  d.hidden = r.integer("hidden_size", 1);
  d.intermediate = r.integer("intermediate_size", 1);
  d.num_layers = r.integer("num_hidden_layers", 1);
  d.vocab = r.integer("vocab_size", 1);
  if (r.find("draft_vocab_size")) {
    const size_t before = problems.size();
    const int64_t dv = r.integer("draft_vocab_size", 1);
    if (problems.size() == before && dv != d.vocab) {
      r.problem(
          fmt::format("draft_vocab_size: {} differs from vocab_size {} (a reduced draft "
                      "vocabulary with d2t/t2d is not supported)",
                      dv, d.vocab));
    }
  }
  d.mla.num_heads = r.integer("num_attention_heads", 1);
  d.mla.q_lora_rank = r.integer("q_lora_rank", 1);
  d.mla.kv_lora_rank = r.integer("kv_lora_rank", 1);
  d.mla.qk_nope_dim = r.integer("qk_nope_head_dim", 1);
  d.mla.qk_rope_dim = r.integer("qk_rope_head_dim", 2);
  d.mla.v_head_dim = r.integer("v_head_dim", 1);
  d.mla.output_gate = false;
  if (d.mla.qk_rope_dim % 2 != 0)
    r.problem(
        fmt::format("qk_rope_head_dim: expected an even number, found {}", d.mla.qk_rope_dim));
  if (r.find("mla_use_output_gate") && r.boolean("mla_use_output_gate"))
    r.problem("mla_use_output_gate: true is not supported (K3 drafts have no output gate)");
  if (r.find("hidden_act")) r.expect_string("hidden_act", "silu");
  d.rms_eps = static_cast<float>(positive(r, "rms_norm_eps", 1e-5));
  d.max_positions = r.integer("max_position_embeddings", 1, int64_t{1} << 40);
  if (d.kind == DraftKind::kEagle3) {
    read_yarn(r, j, "rope_scaling", d.yarn);
    auto ec = j.find("eagle_config");
    if (ec == j.end() || !ec->is_object()) {
      r.problem("eagle_config: missing (expected eagle_aux_hidden_state_layer_ids)");
    } else {
      FieldReader e(*ec, "eagle_config.", problems);
      d.taps.layers = tap_layers(e, "eagle_aux_hidden_state_layer_ids");
    }
    d.taps.stream = TapStream::kPartial;
    d.fc_norm = r.boolean("fc_norm", false);
    d.norm_output = r.boolean("norm_output", false);
    if (d.num_layers != 1)
      r.problem(fmt::format("num_hidden_layers: expected 1 for an EAGLE-3 draft, found {}",
                            d.num_layers));
  } else {
    read_yarn(r, j, "rope_parameters", d.yarn);
    d.taps.layers = tap_layers(r, "target_layer_ids");
    if (r.find("num_target_layers")) {
      const size_t before = problems.size();
      const int64_t n = r.integer("num_target_layers", 1);
      if (problems.size() == before && !d.taps.layers.empty() &&
          n != static_cast<int64_t>(d.taps.layers.size())) {
        r.problem(
            fmt::format("num_target_layers: {} disagrees with target_layer_ids, which lists {}", n,
                        d.taps.layers.size()));
      }
    }
    if (r.find("target_num_hidden_layers"))
      d.target_layers = r.integer("target_num_hidden_layers", 1);
    const std::string stream = r.string("aux_hidden_stream", "prefix");
    if (stream == "attn_res") {
      d.taps.stream = TapStream::kMixture;
    } else if (stream != "prefix") {
      r.problem(fmt::format("aux_hidden_stream: expected \"prefix\" or \"attn_res\", found \"{}\"",
                            stream));
    }
    d.fc_norm = r.boolean("fc_norm", false);
    d.mask_token_id = r.integer("mask_token_id", 0);
    d.markov_rank = r.integer("markov_rank", 1);
    if (r.find("markov_head_type")) r.expect_string("markov_head_type", "vanilla");
    d.confidence_head = r.boolean("enable_confidence_head", false);
    d.confidence_with_markov = r.boolean("confidence_head_with_markov", false);
    if (r.find("target_hidden_size") && r.integer("target_hidden_size", 1) != d.hidden) {
      r.problem(fmt::format("target_hidden_size: {} differs from hidden_size {}",
                            r.integer("target_hidden_size", 1), d.hidden));
    }
  }
  if (!problems.empty()) fail("{}: {}", path, fmt::join(problems, "; "));
  if (d.mask_token_id >= d.vocab)
    fail("{}: mask_token_id {} is outside the vocabulary (0..{})", path, d.mask_token_id,
         d.vocab - 1);
  return d;
}

DraftModelConfig load_draft_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::is_directory(dir))
    fail_setting("draft", dir,
                 "not a folder (expected a draft model folder with config.json and "
                 "model.safetensors)");
  if (!std::filesystem::exists(path))
    fail("{}: missing (a draft model folder holds config.json and model.safetensors)", path);
  return parse_draft_config(read_regular_file(path), path);
}

void check_draft_matches(const DraftModelConfig& d, const ModelConfig& t) {
  if (d.hidden != t.hidden) {
    fail("{}: hidden_size {} does not match the target's {} (a draft trained for another model?)",
         d.path, d.hidden, t.hidden);
  }
  if (d.vocab != t.vocab) {
    fail("{}: vocab_size {} does not match the target's vocabulary of {}", d.path, d.vocab,
         t.vocab);
  }
  if (d.target_layers > 0 && d.target_layers != t.num_layers) {
    fail("{}: target_num_hidden_layers {} does not match the target's {} layers", d.path,
         d.target_layers, t.num_layers);
  }
  validate_taps(d.taps, t, d.path);
}

}  // namespace deltafin
