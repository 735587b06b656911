#include "model/inventory.h"

#include <fmt/format.h>

#include <set>
#include <unordered_map>

#include "core/error.h"
#include "model/vision_config.h"

namespace deltafin {

std::string layer_prefix(const ModelConfig& c, int64_t layer) {
  return c.names.layer(layer);
}

std::string expert_prefix(const ModelConfig& c, int64_t layer, int64_t expert) {
  return c.names.expert(layer, expert);
}

bool is_routed_expert_tensor(const std::string& name) {
  return name.find(".block_sparse_moe.experts.") != std::string::npos;
}

std::vector<std::string> expert_tensor_suffixes(ExpertFormat f) {
  if (f == ExpertFormat::kMXFP4) {
    return {"w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
            "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
  }
  return {"w1.weight", "w2.weight", "w3.weight"};
}

namespace {

// Kimi-Linear's tensors (docs/FAMILY.md KL.3): `model.` names, no AttnRes, KDA with the low-rank
// output gate and BF16 conv taps / o_norm, MLA with one q_proj and no gate, the plain MoE with
// BF16 experts read by the hidden rows directly, and a BF16 correction bias.
std::vector<ExpectedTensor> kimi_linear_tensors(const ModelConfig& c, const InventoryOptions& o) {
  std::vector<ExpectedTensor> out;
  const DType bf = DType::kBF16, f32 = DType::kF32;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dt, int layer = -1,
                 int expert = -1) {
    out.push_back({std::move(name), std::move(shape), dt, layer, expert});
  };
  const int64_t H = c.hidden;
  add(c.names.embed(), {c.vocab, H}, bf);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string P = c.names.layer(i);
    const int L = static_cast<int>(i);
    add(P + "input_layernorm.weight", {H}, bf, L);
    add(P + "post_attention_layernorm.weight", {H}, bf, L);
    const std::string A = P + "self_attn.";
    if (c.is_mla(i)) {
      const auto& m = c.mla;
      add(A + "q_proj.weight", {m.num_heads * m.q_head_dim(), H}, bf, L);
      add(A + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_dim, H}, bf, L);
      add(A + "kv_a_layernorm.weight", {m.kv_lora_rank}, bf, L);
      add(A + "kv_b_proj.weight", {m.num_heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank},
          bf, L);
      add(A + "o_proj.weight", {H, m.num_heads * m.v_head_dim}, bf, L);
    } else {
      const auto& k = c.kda;
      const int64_t Pk = k.proj_dim();
      const int64_t r = o.f_a_rank > 0 ? o.f_a_rank : k.head_dim;
      const int64_t rg = o.g_a_rank > 0 ? o.g_a_rank : k.head_dim;
      add(A + "q_proj.weight", {Pk, H}, bf, L);
      add(A + "k_proj.weight", {Pk, H}, bf, L);
      add(A + "v_proj.weight", {Pk, H}, bf, L);
      add(A + "q_conv1d.weight", {Pk, 1, k.conv_kernel}, bf, L);
      add(A + "k_conv1d.weight", {Pk, 1, k.conv_kernel}, bf, L);
      add(A + "v_conv1d.weight", {Pk, 1, k.conv_kernel}, bf, L);
      add(A + "A_log", {1, 1, k.num_heads, 1}, f32, L);
      add(A + "dt_bias", {Pk}, f32, L);
      add(A + "f_a_proj.weight", {r, H}, bf, L);
      add(A + "f_b_proj.weight", {Pk, r}, bf, L);
      add(A + "b_proj.weight", {k.num_heads, H}, bf, L);
      add(A + "g_a_proj.weight", {rg, H}, bf, L);
      add(A + "g_b_proj.weight", {Pk, rg}, bf, L);
      add(A + "o_norm.weight", {k.head_dim}, bf, L);
      add(A + "o_proj.weight", {H, Pk}, bf, L);
    }
    if (c.is_dense(i)) {
      add(P + "mlp.gate_proj.weight", {c.dense_intermediate, H}, bf, L);
      add(P + "mlp.up_proj.weight", {c.dense_intermediate, H}, bf, L);
      add(P + "mlp.down_proj.weight", {H, c.dense_intermediate}, bf, L);
    } else {
      const auto& m = c.moe;
      const std::string M = c.names.moe(i);
      add(M + "gate.weight", {m.num_experts, H}, bf, L);
      add(M + "gate.e_score_correction_bias", {m.num_experts}, bf, L);
      if (m.num_shared_experts > 0) {
        add(M + "shared_experts.gate_proj.weight", {m.shared_intermediate(), H}, bf, L);
        add(M + "shared_experts.up_proj.weight", {m.shared_intermediate(), H}, bf, L);
        add(M + "shared_experts.down_proj.weight", {H, m.shared_intermediate()}, bf, L);
      }
      const int64_t I = m.intermediate;
      for (int64_t e = 0; e < m.num_experts; ++e) {
        const std::string E = c.names.expert(i, e);
        const int X = static_cast<int>(e);
        add(E + "w1.weight", {I, H}, bf, L, X);
        add(E + "w2.weight", {H, I}, bf, L, X);
        add(E + "w3.weight", {I, H}, bf, L, X);
      }
    }
  }
  add(c.names.final_norm(), {H}, bf);
  if (!c.tie_embeddings) add(c.names.lm_head(), {c.vocab, H}, bf);
  return out;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, const InventoryOptions& o) {
  if (c.family == Family::kKimiLinear) return kimi_linear_tensors(c, o);
  std::vector<ExpectedTensor> out;
  const DType bf = DType::kBF16, f32 = DType::kF32, u8 = DType::kU8;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dt, int layer = -1,
                 int expert = -1) {
    out.push_back({std::move(name), std::move(shape), dt, layer, expert});
  };
  const int64_t H = c.hidden;
  add(c.names.embed(), {c.vocab, H}, bf);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string P = layer_prefix(c, i);
    const int L = static_cast<int>(i);
    add(P + "input_layernorm.weight", {H}, bf, L);
    add(P + "post_attention_layernorm.weight", {H}, bf, L);
    add(P + "self_attention_res_norm.weight", {H}, bf, L);
    add(P + "self_attention_res_proj.weight", {1, H}, bf, L);
    add(P + "mlp_res_norm.weight", {H}, bf, L);
    add(P + "mlp_res_proj.weight", {1, H}, bf, L);
    const std::string A = P + "self_attn.";
    if (c.is_mla(i)) {
      const auto& m = c.mla;
      add(A + "q_a_proj.weight", {m.q_lora_rank, H}, bf, L);
      add(A + "q_a_layernorm.weight", {m.q_lora_rank}, bf, L);
      add(A + "q_b_proj.weight", {m.num_heads * m.q_head_dim(), m.q_lora_rank}, bf, L);
      add(A + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_dim, H}, bf, L);
      add(A + "kv_a_layernorm.weight", {m.kv_lora_rank}, bf, L);
      add(A + "kv_b_proj.weight", {m.num_heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank},
          bf, L);
      if (m.output_gate) add(A + "g_proj.weight", {m.num_heads * m.v_head_dim, H}, bf, L);
      add(A + "o_proj.weight", {H, m.num_heads * m.v_head_dim}, bf, L);
    } else {
      const auto& k = c.kda;
      const int64_t Pk = k.proj_dim();
      const int64_t r = o.f_a_rank > 0 ? o.f_a_rank : k.head_dim;
      add(A + "q_proj.weight", {Pk, H}, bf, L);
      add(A + "k_proj.weight", {Pk, H}, bf, L);
      add(A + "v_proj.weight", {Pk, H}, bf, L);
      add(A + "q_conv1d.weight", {Pk, 1, k.conv_kernel}, f32, L);
      add(A + "k_conv1d.weight", {Pk, 1, k.conv_kernel}, f32, L);
      add(A + "v_conv1d.weight", {Pk, 1, k.conv_kernel}, f32, L);
      add(A + "f_a_proj.weight", {r, H}, bf, L);
      add(A + "f_b_proj.weight", {Pk, r}, bf, L);
      add(A + "dt_bias", {Pk}, f32, L);
      add(A + "A_log", {k.a_log_len()}, f32, L);
      add(A + "b_proj.weight", {k.num_heads, H}, bf, L);
      add(A + "g_proj.weight", {Pk, H}, bf, L);
      add(A + "o_norm.weight", {k.head_dim}, f32, L);
      add(A + "o_proj.weight", {H, Pk}, bf, L);
    }
    if (c.is_dense(i)) {
      add(P + "mlp.gate_proj.weight", {c.dense_intermediate, H}, bf, L);
      add(P + "mlp.up_proj.weight", {c.dense_intermediate, H}, bf, L);
      add(P + "mlp.down_proj.weight", {H, c.dense_intermediate}, bf, L);
    } else {
      const auto& m = c.moe;
      const std::string M = P + "block_sparse_moe.";
      add(M + "gate.weight", {m.num_experts, H}, bf, L);
      add(M + "gate.e_score_correction_bias", {m.num_experts}, f32, L);
      add(M + "routed_expert_down_proj.weight", {m.latent_dim, H}, bf, L);
      if (m.latent_norm) add(M + "routed_expert_norm.weight", {m.latent_dim}, bf, L);
      add(M + "routed_expert_up_proj.weight", {H, m.latent_dim}, bf, L);
      if (m.num_shared_experts > 0) {
        add(M + "shared_experts.gate_proj.weight", {m.shared_intermediate(), H}, bf, L);
        add(M + "shared_experts.up_proj.weight", {m.shared_intermediate(), H}, bf, L);
        add(M + "shared_experts.down_proj.weight", {H, m.shared_intermediate()}, bf, L);
      }
      const int64_t I = m.intermediate, Hl = m.latent_dim;
      for (int64_t e = 0; e < m.num_experts; ++e) {
        const std::string E = expert_prefix(c, i, e);
        const int X = static_cast<int>(e);
        if (o.expert_format == ExpertFormat::kMXFP4) {
          add(E + "w1.weight_packed", {I, Hl / 2}, u8, L, X);
          add(E + "w1.weight_scale", {I, Hl / 32}, u8, L, X);
          add(E + "w2.weight_packed", {Hl, I / 2}, u8, L, X);
          add(E + "w2.weight_scale", {Hl, I / 32}, u8, L, X);
          add(E + "w3.weight_packed", {I, Hl / 2}, u8, L, X);
          add(E + "w3.weight_scale", {I, Hl / 32}, u8, L, X);
        } else {
          add(E + "w1.weight", {I, Hl}, bf, L, X);
          add(E + "w2.weight", {Hl, I}, bf, L, X);
          add(E + "w3.weight", {I, Hl}, bf, L, X);
        }
      }
    }
  }
  add("language_model.model.norm.weight", {H}, bf);
  add("language_model.model.output_attn_res_norm.weight", {H}, bf);
  add("language_model.model.output_attn_res_proj.weight", {1, H}, bf);
  if (!c.tie_embeddings) add("language_model.lm_head.weight", {c.vocab, H}, bf);
  return out;
}

namespace {
bool ignored_name(const std::string& n) {
  for (const char* p : {"language_model.vision_tower.", "language_model.mm_projector."}) {
    if (n.rfind(p, 0) == 0) return true;
  }
  return false;
}

void append_limited(std::string& msg, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  constexpr size_t kShow = 40;
  msg += fmt::format("\n  {} ({}):", title, items.size());
  for (size_t i = 0; i < items.size() && i < kShow; ++i) msg += "\n    " + items[i];
  if (items.size() > kShow) msg += fmt::format("\n    ... and {} more", items.size() - kShow);
}
}  // namespace

InventoryReport check_inventory(const ModelConfig& c, const TensorTable& tensors,
                                const std::string& dir) {
  auto find = [&](const std::string& name) -> const TensorInfo* {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  };
  InventoryReport rep;
  // The expert format follows the config (quantization_config = MXFP4); the tensors must agree.
  rep.expert_format = c.expert_format();
  // f_a_proj's (and Kimi-Linear's g_a_proj's) rank is whatever the first KDA layer's tensor
  // says; every layer must agree.
  auto rank_of = [&](const char* name) -> int64_t {
    for (int64_t i = 0; i < c.num_layers; ++i) {
      if (c.is_mla(i)) continue;
      if (const TensorInfo* t = find(layer_prefix(c, i) + "self_attn." + name);
          t != nullptr && t->shape.size() == 2 && t->shape[0] > 0) {
        return t->shape[0];
      }
    }
    return 0;
  };
  rep.f_a_rank = rank_of("f_a_proj.weight");
  InventoryOptions opt{rep.expert_format, rep.f_a_rank};
  if (c.kda.low_rank_output_gate) opt.g_a_rank = rank_of("g_a_proj.weight");
  auto expected = expected_tensors(c, opt);
  // A vision checkpoint: its tower and projector are part of the inventory.
  for (const auto& [name, t] : tensors) {
    if (is_vision_tensor(name)) {
      rep.vision = true;
      break;
    }
  }
  // A vision_config that cannot describe them leaves every vision tensor unexpected, and its
  // problems join the one error.
  std::string vision_problem;
  if (rep.vision) {
    try {
      const auto vision = expected_vision_tensors(vision_config_of(c));
      rep.vision_tensors = vision.size();
      expected.insert(expected.end(), vision.begin(), vision.end());
    } catch (const InvalidArgument& e) {
      vision_problem = e.what();
    }
  }

  std::vector<std::string> missing, extra, shape_bad, dtype_bad;
  std::set<std::string> expected_names;
  for (const auto& e : expected) {
    expected_names.insert(e.name);
    const TensorInfo* t = find(e.name);
    if (t == nullptr) {
      missing.push_back(fmt::format("{} (expected {} {})", e.name, dtype_name(e.dtype),
                                    shape_to_string(e.shape)));
      continue;
    }
    ++rep.checked;
    bool shape_ok = t->shape == e.shape;
    // A_log may also be stored unpadded (exactly num_heads entries).
    if (!shape_ok && c.family == Family::kK3 && e.name.ends_with(".A_log") &&
        t->shape == std::vector<int64_t>{c.kda.num_heads}) {
      shape_ok = true;
    }
    if (!shape_ok) {
      shape_bad.push_back(fmt::format("{}: expected {}, found {}", e.name, shape_to_string(e.shape),
                                      t->shape_string()));
    }
    if (t->dtype != e.dtype) {
      dtype_bad.push_back(fmt::format("{}: expected {}, found {}", e.name, dtype_name(e.dtype),
                                      dtype_name(t->dtype)));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (expected_names.count(name)) continue;
    if (c.family == Family::kK3 && ignored_name(name)) {
      ++rep.ignored;
      continue;
    }
    extra.push_back(fmt::format("{} ({} {})", name, dtype_name(t.dtype), t.shape_string()));
  }
  if (!missing.empty() || !extra.empty() || !shape_bad.empty() || !dtype_bad.empty() ||
      !vision_problem.empty()) {
    std::string msg = fmt::format(
        "{}: the tensors do not match {} (a {} checkpoint; {} routed experts expected, as "
        "the config {} a quantization_config)",
        dir, c.path, family_name(c.family),
        rep.expert_format == ExpertFormat::kMXFP4 ? "MXFP4" : "BF16",
        c.quantized_experts ? "has" : "has no");
    append_limited(msg, "missing", missing);
    append_limited(msg, "extra", extra);
    append_limited(msg, "wrong shape", shape_bad);
    append_limited(msg, "wrong dtype", dtype_bad);
    if (!vision_problem.empty()) msg += "\n  the vision tensors are unexpected: " + vision_problem;
    throw Error(msg);
  }
  return rep;
}

}  // namespace deltafin
