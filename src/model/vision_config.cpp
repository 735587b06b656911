// vision_config parsing (docs/VISION.md §2.1) with the text model's FieldReader, so an error has
// the same shape as a text_config error: every problem listed, each naming the field, what was
// expected and what was found. The defaults are the table's "default" column.
#include "model/vision_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_parse.h"
#include "model/field_reader.h"

namespace deltafin {

using nlohmann::json;

namespace {

[[noreturn]] void fail_vision(const std::string& path, const std::vector<std::string>& problems) {
  constexpr size_t kShown = 20;
  std::vector<std::string> shown(problems.begin(),
                                 problems.begin() + std::min(problems.size(), kShown));
  if (problems.size() > kShown)
    shown.push_back(fmt::format("... and {} more problems", problems.size() - kShown));
  fail_arg("{}: invalid vision_config:\n  {}", path, fmt::join(shown, "\n  "));
}

// A string field that must be one of `allowed` (absent: `fallback`); returns its index.
size_t choice(FieldReader& r, const char* key, const std::vector<std::string>& allowed,
              const std::string& fallback) {
  const std::string v = r.string(key, fallback);
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (v == allowed[i]) return i;
  }
  if (const json* j = r.find(key); j != nullptr && j->is_string()) {
    r.problem(fmt::format("{}: expected {}, found \"{}\" (not implemented)", r.name(key),
                          fmt::join(allowed, " or "), v));
  }
  return 0;
}

int64_t bounded(FieldReader& r, const char* key, int64_t fallback, int64_t hi) {
  const int64_t v = r.integer(key, 1, fallback);
  if (v > hi) {
    r.problem(fmt::format("{}: expected an integer from 1 to {}, found {}", r.name(key), hi, v));
    return fallback;
  }
  return v;
}

}  // namespace

VisionConfig parse_vision_config(const json& vc, int64_t text_hidden, const std::string& path) {
  std::vector<std::string> problems;
  if (!vc.is_object()) {
    problems.push_back(
        fmt::format("vision_config: expected an object, found {}", vc.dump().substr(0, 80)));
    fail_vision(path, problems);
  }
  FieldReader r(vc, "vision_config.", problems);
  VisionConfig v;
  v.path = path;
  v.patch = bounded(r, "patch_size", 14, 64);
  v.pos_h = bounded(r, "init_pos_emb_height", 64, 1024);
  v.pos_w = bounded(r, "init_pos_emb_width", 64, 1024);
  v.pos_t = bounded(r, "init_pos_emb_time", 4, 64);
  v.hidden = bounded(r, "vt_hidden_size", 1024, 65536);
  v.heads = bounded(r, "vt_num_attention_heads", 12, 256);
  v.layers = bounded(r, "vt_num_hidden_layers", 27, 256);
  v.intermediate = bounded(r, "vt_intermediate_size", 4096, int64_t{1} << 20);
  v.qkv = bounded(r, "qkv_hidden_size", 1536, 65536);
  v.text_hidden = bounded(r, "text_hidden_size", 7168, int64_t{1} << 20);
  const int64_t mm_hidden = bounded(r, "mm_hidden_size", v.hidden, 65536);
  choice(r, "pos_emb_type", {"divided_fixed"}, "divided_fixed");
  v.pos_interpolation =
      choice(r, "pos_emb_interpolation_mode", {"bilinear", "bicubic"}, "bilinear") == 0
          ? PosInterpolation::kBilinear
          : PosInterpolation::kBicubic;
  choice(r, "norm_type", {"rmsnorm"}, "rmsnorm");
  choice(r, "mlp_type", {"mlp2"}, "mlp2");
  v.activation =
      choice(r, "activation_func", {"gelu_pytorch_tanh", "gelu"}, "gelu_pytorch_tanh") == 0
          ? VisionActivation::kGeluTanh
          : VisionActivation::kGeluErf;
  choice(r, "merge_type", {"sd2_tpool"}, "sd2_tpool");
  choice(r, "mm_projector_type", {"patchmergerv2"}, "patchmergerv2");
  choice(r, "projector_hidden_act", {"gelu"}, "gelu");
  choice(r, "video_attn_type", {"spatial_temporal"}, "spatial_temporal");
  v.attn_bias = r.boolean("attn_bias", false);
  v.linear_bias = r.boolean("linear_bias", false);
  v.patch_bias = r.boolean("patch_embed_proj_bias", false);
  const double eps = r.number("projector_ln_eps", 1e-5);
  if (!(eps > 0 && eps < 1)) {
    r.problem(
        fmt::format("vision_config.projector_ln_eps: expected a number in (0, 1), found {}", eps));
  }
  v.projector_eps = static_cast<float>(eps);
  if (const json* mk = r.find("merge_kernel_size"); mk != nullptr && !mk->is_null()) {
    bool ok = mk->is_array() && mk->size() == 2;
    for (size_t i = 0; ok && i < 2; ++i) {
      ok = (*mk)[i].is_number_integer() && (*mk)[i].get<int64_t>() >= 1 &&
           (*mk)[i].get<int64_t>() <= 8;
    }
    if (ok) {
      v.merge_h = (*mk)[0].get<int64_t>();
      v.merge_w = (*mk)[1].get<int64_t>();
    } else {
      r.problem(fmt::format(
          "vision_config.merge_kernel_size: expected [rows, columns] from 1 to 8, found {}",
          mk->dump().substr(0, 80)));
    }
  }
  if (const json* a = r.find("_attn_implementation");
      a != nullptr && !a->is_null() && !a->is_string()) {
    r.problem("vision_config._attn_implementation: expected a string");
  }
  if (problems.empty()) {
    if (v.qkv % v.heads != 0 || v.head_dim() % 4 != 0) {
      r.problem(fmt::format(
          "vision_config.qkv_hidden_size ({}) must split into vt_num_attention_heads ({}) heads "
          "of a multiple of 4 (the 2-D rotary pairs, docs/VISION.md §4.6)",
          v.qkv, v.heads));
    }
    if (v.hidden % 2 != 0) {
      r.problem(fmt::format(
          "vision_config.vt_hidden_size ({}) must be even (the time embedding's sin|cos halves)",
          v.hidden));
    }
    if (mm_hidden != v.hidden) {
      r.problem(fmt::format("vision_config.mm_hidden_size ({}) must equal vt_hidden_size ({})",
                            mm_hidden, v.hidden));
    }
    if (text_hidden >= 0 && v.text_hidden != text_hidden) {
      r.problem(fmt::format(
          "vision_config.text_hidden_size ({}) must equal text_config.hidden_size ({}): the "
          "projector's rows become the text model's input embeddings",
          v.text_hidden, text_hidden));
    }
  }
  if (!problems.empty()) fail_vision(path, problems);
  return v;
}

VisionConfig parse_vision_config_text(const std::string& config_json, const std::string& path) {
  const json root = parse_json(config_json, path);
  if (!root.is_object()) fail_arg("{}: expected a JSON object at the top level", path);
  bool arch_ok = false;
  if (auto a = root.find("architectures"); a != root.end() && a->is_array()) {
    for (const auto& s : *a)
      arch_ok |= s.is_string() && s.get<std::string>() == "KimiK3ForConditionalGeneration";
  }
  if (!arch_ok) {
    fail_arg("{}: architectures: expected [\"KimiK3ForConditionalGeneration\"], found {}", path,
             root.contains("architectures") ? root["architectures"].dump() : "nothing");
  }
  auto vc = root.find("vision_config");
  if (vc == root.end()) fail_arg("{}: vision_config: missing (expected the tower's object)", path);
  int64_t text_hidden = -1;
  if (auto tc = root.find("text_config"); tc != root.end() && tc->is_object()) {
    if (auto h = tc->find("hidden_size"); h != tc->end() && h->is_number_integer())
      text_hidden = h->get<int64_t>();
  }
  VisionConfig v = parse_vision_config(*vc, text_hidden, path);
  if (auto p = root.find("media_placeholder_token_id"); p != root.end()) {
    if (!p->is_number_integer() || p->get<int64_t>() < 0 || p->get<int64_t>() > INT32_MAX) {
      fail_arg("{}: media_placeholder_token_id: expected a token id, found {}", path,
               p->dump().substr(0, 80));
    }
    v.placeholder_id = p->get<int64_t>();
  }
  return v;
}

VisionConfig vision_config_of(const ModelConfig& c) {
  if (c.vision_config_json.empty())
    fail_arg("{}: vision_config: missing (expected the tower's object)", c.path);
  return parse_vision_config(parse_json(c.vision_config_json, c.path), c.hidden, c.path);
}

bool is_vision_tensor(const std::string& name) {
  return name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
}

std::vector<ExpectedTensor> expected_vision_tensors(const VisionConfig& v) {
  std::vector<ExpectedTensor> out;
  const DType bf = DType::kBF16;
  auto add = [&](std::string name, std::vector<int64_t> shape, int layer = -1) {
    out.push_back({std::move(name), std::move(shape), bf, layer, -1});
  };
  const int64_t D = v.hidden, P = v.patch, Q = v.qkv, I = v.intermediate;
  add("vision_tower.patch_embed.proj.weight", {D, 3, P, P});
  if (v.patch_bias) add("vision_tower.patch_embed.proj.bias", {D});
  add("vision_tower.patch_embed.pos_emb.weight", {v.pos_h, v.pos_w, D});
  for (int64_t i = 0; i < v.layers; ++i) {
    const std::string b = fmt::format("vision_tower.encoder.blocks.{}.", i);
    const int L = static_cast<int>(i);
    add(b + "norm0.weight", {D}, L);
    add(b + "wqkv.weight", {3 * Q, D}, L);
    if (v.attn_bias) add(b + "wqkv.bias", {3 * Q}, L);
    add(b + "wo.weight", {D, Q}, L);
    if (v.attn_bias) add(b + "wo.bias", {D}, L);
    add(b + "norm1.weight", {D}, L);
    add(b + "mlp.fc0.weight", {I, D}, L);
    if (v.linear_bias) add(b + "mlp.fc0.bias", {I}, L);
    add(b + "mlp.fc1.weight", {D, I}, L);
    if (v.linear_bias) add(b + "mlp.fc1.bias", {D}, L);
  }
  add("vision_tower.encoder.final_layernorm.weight", {D});
  const int64_t M = v.merged_dim();
  add("mm_projector.proj.0.weight", {M, M});
  add("mm_projector.proj.2.weight", {v.text_hidden, M});
  add("mm_projector.post_norm.weight", {v.text_hidden});
  return out;
}

void check_vision_inventory(const VisionConfig& v, const TensorTable& tensors,
                            const std::string& dir) {
  std::vector<std::string> problems;
  std::set<std::string> names;
  for (const auto& e : expected_vision_tensors(v)) {
    names.insert(e.name);
    auto it = tensors.find(e.name);
    if (it == tensors.end()) {
      problems.push_back(fmt::format("missing {} (expected {} {})", e.name, dtype_name(e.dtype),
                                     shape_to_string(e.shape)));
      continue;
    }
    if (it->second.shape != e.shape) {
      problems.push_back(fmt::format("{}: expected shape {}, found {}", e.name,
                                     shape_to_string(e.shape), it->second.shape_string()));
    }
    if (it->second.dtype != e.dtype) {
      problems.push_back(fmt::format("{}: expected {}, found {}", e.name, dtype_name(e.dtype),
                                     dtype_name(it->second.dtype)));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (is_vision_tensor(name) && names.count(name) == 0)
      problems.push_back(
          fmt::format("extra {} ({} {})", name, dtype_name(t.dtype), t.shape_string()));
  }
  if (problems.empty()) return;
  // Whole blocks missing or extra is one fact, not 6 per block: say it first, so the layer count
  // is named even when the list below is cut short.
  int64_t blocks = 0;
  const std::string block_prefix = "vision_tower.encoder.blocks.";
  for (const auto& [name, t] : tensors) {
    if (name.rfind(block_prefix, 0) != 0) continue;
    const std::string rest = name.substr(block_prefix.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || dot > 6) continue;
    if (rest.find_first_not_of("0123456789") != dot) continue;
    blocks = std::max<int64_t>(blocks, std::stoll(rest.substr(0, dot)) + 1);
  }
  if (blocks != v.layers) {
    problems.insert(problems.begin(),
                    fmt::format("vision_config.vt_num_hidden_layers is {} (27 when absent) but the "
                                "checkpoint holds encoder blocks for {} layers",
                                v.layers, blocks));
  }
  constexpr size_t kShown = 40;
  std::string msg = fmt::format("{}: the vision tensors do not match {} ({} problems):", dir,
                                v.path, problems.size());
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kShown) msg += fmt::format("\n  ... and {} more", problems.size() - kShown);
  throw Error(msg);
}

}  // namespace deltafin
