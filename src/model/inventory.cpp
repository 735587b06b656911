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
  return name.find(".block_sparse_moe.experts.") != std::string::npos ||
         name.find(".mlp.experts.") != std::string::npos;
}

std::vector<ExpertTensor> expert_tensors(const ModelConfig& c, ExpertFormat f) {
  // On disk: K3 and Kimi-Linear write w1, w2, w3; DeepSeek-V3 / K2 gate, up, down.
  const auto& n = c.names.expert_proj;
  const std::vector<int> order =
      c.family == Family::kDeepseekV3 ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 1, 2};
  std::vector<ExpertTensor> out;
  for (int m : order) {
    const std::string& p = n[static_cast<size_t>(m)];
    switch (f) {
      case ExpertFormat::kMXFP4:
        out.push_back({p + ".weight_packed", m, ExpertPart::kWeight});
        out.push_back({p + ".weight_scale", m, ExpertPart::kScale});
        break;
      case ExpertFormat::kBF16:
        out.push_back({p + ".weight", m, ExpertPart::kWeight});
        break;
      case ExpertFormat::kFP8:
        out.push_back({p + ".weight", m, ExpertPart::kWeight});
        out.push_back({p + ".weight_scale_inv", m, ExpertPart::kScale});
        break;
      case ExpertFormat::kInt4:
        out.push_back({p + ".weight_packed", m, ExpertPart::kWeight});
        out.push_back({p + ".weight_scale", m, ExpertPart::kScale});
        out.push_back({p + ".weight_shape", m, ExpertPart::kShape});
        break;
    }
  }
  return out;
}

std::vector<std::string> expert_tensor_suffixes(const ModelConfig& c, ExpertFormat f) {
  std::vector<std::string> out;
  for (const auto& t : expert_tensors(c, f)) out.push_back(t.suffix);
  return out;
}

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& w) {
  return {(w[0] + 127) / 128, (w[1] + 127) / 128};
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

// DeepSeek-V3 / Kimi K2's tensors (docs/FAMILY.md "DeepSeek-V3 and Kimi K2", §Tensors): `model.`
// names (K2.5: under `language_model.`), no AttnRes, MLA with q_a/q_b and no gate, `mlp.` with a
// dense MLP or a router with its F32 correction bias, shared experts and gate/up/down experts.
// Linears are BF16, or FP8 with F32 block scales (fp8_trunk); routed experts in the expert format.
// The MTP layers (num_nextn_predict_layers) follow the decoder layers: the embedding copy, enorm,
// hnorm, eh_proj, a whole MoE decoder layer and the shared head.
std::vector<ExpectedTensor> deepseek_v3_tensors(const ModelConfig& c, const InventoryOptions& o) {
  std::vector<ExpectedTensor> out;
  const DType bf = DType::kBF16, f32 = DType::kF32;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dt, int layer = -1,
                 int expert = -1) {
    out.push_back({std::move(name), std::move(shape), dt, layer, expert});
  };
  // A trunk linear: BF16, or FP8 followed by its block scales.
  auto quantised = [&](std::string name, std::vector<int64_t> shape, DType dt, int layer,
                       int expert, const std::vector<int64_t>& logical) {
    out.push_back({std::move(name), std::move(shape), dt, layer, expert, logical});
  };
  auto linear = [&](const std::string& name, std::vector<int64_t> shape, int layer) {
    if (!o.fp8_trunk) return add(name, std::move(shape), bf, layer);
    quantised(name, shape, DType::kF8E4M3, layer, -1, shape);
    quantised(name + "_scale_inv", fp8_scale_shape(shape), f32, layer, -1, shape);
  };
  auto expert_linear = [&](const std::string& name, std::vector<int64_t> shape, int layer, int e) {
    switch (o.expert_format) {
      case ExpertFormat::kFP8:
        quantised(name, shape, DType::kF8E4M3, layer, e, shape);
        quantised(name + "_scale_inv", fp8_scale_shape(shape), f32, layer, e, shape);
        break;
      case ExpertFormat::kInt4:
        quantised(name + "_packed", {shape[0], (shape[1] + 7) / 8}, DType::kI32, layer, e, shape);
        quantised(name + "_scale", {shape[0], (shape[1] + 31) / 32}, bf, layer, e, shape);
        quantised(name + "_shape", {2}, DType::kI64, layer, e, shape);
        break;
      default:
        add(name, std::move(shape), bf, layer, e);
    }
  };
  const int64_t H = c.hidden;
  const auto& m = c.mla;
  add(c.names.embed(), {c.vocab, H}, bf);
  for (int64_t i = 0; i < c.num_layers + c.mtp_layers; ++i) {
    const std::string P = c.names.layer(i);
    const int L = static_cast<int>(i);
    const bool mtp = i >= c.num_layers;
    if (mtp) {
      add(P + "embed_tokens.weight", {c.vocab, H}, bf, L);
      add(P + "enorm.weight", {H}, bf, L);
      add(P + "hnorm.weight", {H}, bf, L);
      add(P + "eh_proj.weight", {H, 2 * H}, bf, L);
    }
    add(P + "input_layernorm.weight", {H}, bf, L);
    const std::string A = P + "self_attn.";
    if (m.q_lora_rank > 0) {
      linear(A + "q_a_proj.weight", {m.q_lora_rank, H}, L);
      add(A + "q_a_layernorm.weight", {m.q_lora_rank}, bf, L);
      linear(A + "q_b_proj.weight", {m.num_heads * m.q_head_dim(), m.q_lora_rank}, L);
    } else {
      linear(A + "q_proj.weight", {m.num_heads * m.q_head_dim(), H}, L);
    }
    linear(A + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_dim, H}, L);
    add(A + "kv_a_layernorm.weight", {m.kv_lora_rank}, bf, L);
    linear(A + "kv_b_proj.weight", {m.num_heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank},
           L);
    linear(A + "o_proj.weight", {H, m.num_heads * m.v_head_dim}, L);
    add(P + "post_attention_layernorm.weight", {H}, bf, L);
    if (!mtp && c.is_dense(i)) {
      linear(P + "mlp.gate_proj.weight", {c.dense_intermediate, H}, L);
      linear(P + "mlp.up_proj.weight", {c.dense_intermediate, H}, L);
      linear(P + "mlp.down_proj.weight", {H, c.dense_intermediate}, L);
    } else {
      const auto& e = c.moe;
      const std::string M = c.names.moe(i);
      add(M + "gate.weight", {e.num_experts, H}, bf, L);
      add(M + "gate.e_score_correction_bias", {e.num_experts}, f32, L);
      const int64_t I = e.intermediate;
      for (int64_t x = 0; x < e.num_experts; ++x) {
        const std::string E = c.names.expert(i, x);
        const int X = static_cast<int>(x);
        expert_linear(E + "gate_proj.weight", {I, H}, L, X);
        expert_linear(E + "up_proj.weight", {I, H}, L, X);
        expert_linear(E + "down_proj.weight", {H, I}, L, X);
      }
      if (e.num_shared_experts > 0) {
        linear(M + "shared_experts.gate_proj.weight", {e.shared_intermediate(), H}, L);
        linear(M + "shared_experts.up_proj.weight", {e.shared_intermediate(), H}, L);
        linear(M + "shared_experts.down_proj.weight", {H, e.shared_intermediate()}, L);
      }
    }
    if (mtp) {
      add(P + "shared_head.norm.weight", {H}, bf, L);
      add(P + "shared_head.head.weight", {c.vocab, H}, bf, L);
    }
  }
  add(c.names.final_norm(), {H}, bf);
  if (!c.tie_embeddings) add(c.names.lm_head(), {c.vocab, H}, bf);
  return out;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, const InventoryOptions& o) {
  if (c.family == Family::kKimiLinear) return kimi_linear_tensors(c, o);
  if (c.family == Family::kDeepseekV3) return deepseek_v3_tensors(c, o);
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
// Tensors a checkpoint may hold that the text model does not use: K3's older nested vision tower
// and projector, K2.5's tower and projector (not run: its vision_config is not K3's); the rotary
// tables some DeepSeek-V3 / K2 exports carry per layer (the engine computes its own, docs/FAMILY.md
// §Files).
bool ignored_name(const ModelConfig& c, const std::string& n) {
  if (c.family == Family::kK3) {
    for (const char* p : {"language_model.vision_tower.", "language_model.mm_projector."}) {
      if (n.rfind(p, 0) == 0) return true;
    }
  }
  if (c.family == Family::kDeepseekV3 && c.names.prefix == "language_model.") {
    for (const char* p : {"vision_tower.", "mm_projector.", "language_model.vision_tower.",
                          "language_model.mm_projector."}) {
      if (n.rfind(p, 0) == 0) return true;
    }
  }
  if (c.family == Family::kDeepseekV3 && n.rfind(c.names.prefix + "model.layers.", 0) == 0) {
    for (const char* x : {".self_attn.rotary_emb.inv_freq", ".self_attn.rotary_emb.cos_cached",
                          ".self_attn.rotary_emb.sin_cached"}) {
      if (n.ends_with(x)) return true;
    }
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
  opt.fp8_trunk = c.fp8_trunk;
  auto expected = expected_tensors(c, opt);
  // DeepSeek-V3's MTP eh_proj is BF16 as far as any release shows; an FP8 one (with its block
  // scales) is accepted too (docs/FAMILY.md §Tensors).
  for (size_t i = 0; i < expected.size(); ++i) {
    ExpectedTensor& e = expected[i];
    const TensorInfo* t = find(e.name);
    if (c.fp8_trunk && e.name.ends_with(".eh_proj.weight") && t != nullptr &&
        t->dtype == DType::kF8E4M3) {
      e.dtype = DType::kF8E4M3;
      e.logical = e.shape;
      expected.insert(expected.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                      ExpectedTensor{e.name + "_scale_inv", fp8_scale_shape(e.shape), DType::kF32,
                                     e.layer, -1, e.shape});
      break;
    }
  }
  // A vision checkpoint: its tower and projector are part of the inventory (K2.5's are ignored).
  for (const auto& [name, t] : tensors) {
    if (c.family != Family::kDeepseekV3 && is_vision_tensor(name)) {
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
    // INT4's logical shape: I64 as the Kimi files write it, or I32 as compressed-tensors declares.
    const bool shape_i32 =
        e.dtype == DType::kI64 && t->dtype == DType::kI32 && e.name.ends_with(".weight_shape");
    if (t->dtype != e.dtype && !shape_i32) {
      dtype_bad.push_back(fmt::format("{}: expected {}, found {}", e.name, dtype_name(e.dtype),
                                      dtype_name(t->dtype)));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (expected_names.count(name)) continue;
    if (ignored_name(c, name)) {
      ++rep.ignored;
      continue;
    }
    extra.push_back(fmt::format("{} ({} {})", name, dtype_name(t.dtype), t.shape_string()));
  }
  if (!missing.empty() || !extra.empty() || !shape_bad.empty() || !dtype_bad.empty() ||
      !vision_problem.empty()) {
    std::string msg = fmt::format(
        "{}: the tensors do not match {} (a {} checkpoint; {} routed experts{} expected, as "
        "the config {} a quantization_config)",
        dir, c.path, family_name(c.family), expert_format_name(rep.expert_format),
        c.fp8_trunk ? " and FP8 trunk linears" : "", c.quantized_experts ? "has" : "has no");
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
