#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/inventory.h"
#include "tensor/quant.h"
#include "tensor/tensor_info.h"

namespace deltafin {

Matrix weight_matrix(const TensorInfo& t, const uint8_t* bytes) {
  if (t.shape.size() != 2)
    fail("tensor {}: expected a matrix, found shape {}", t.name, t.shape_string());
  Matrix m;
  m.rows = t.shape[0];
  m.cols = t.shape[1];
  m.data = bytes;
  switch (t.dtype) {
    case DType::kBF16:
      m.format = WeightFormat::kBF16;
      if (reinterpret_cast<uintptr_t>(bytes) % 2 != 0) {
        fail("tensor {}: BF16 data at an odd file offset {} (the safetensors header is not padded)",
             t.name, t.offset);
      }
      break;
    case DType::kF32:
      m.format = WeightFormat::kF32;
      if (reinterpret_cast<uintptr_t>(bytes) % 4 != 0) {
        fail("tensor {}: F32 data at unaligned file offset {}", t.name, t.offset);
      }
      break;
    default:
      fail("tensor {}: dtype {} cannot be used as a weight matrix (expected BF16)", t.name,
           dtype_name(t.dtype));
  }
  return m;
}

std::vector<float> weight_vector(const TensorInfo& t, const uint8_t* bytes) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) {
    std::memcpy(v.data(), bytes, v.size() * 4);
  } else if (t.dtype == DType::kBF16) {
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      v[i] = bf16_to_f32(h);
    }
  } else {
    fail("tensor {}: dtype {} cannot be read as a float vector (expected F32 or BF16)", t.name,
         dtype_name(t.dtype));
  }
  return v;
}

Matrix lookup_matrix(const TensorLookup& lookup, const std::string& name) {
  auto [t, b] = lookup(name);
  if (t->dtype != DType::kF8E4M3) return weight_matrix(*t, b);
  auto [st, sb] = lookup(name + "_scale_inv");  // quant.h checks the pair
  Matrix m = fp8_block_matrix(*t, *st);
  m.data = b;  // the lookup's bytes: a mapped shard or a streamed copy
  m.scales = sb;
  return m;
}

std::vector<float> lookup_vector(const TensorLookup& lookup, const std::string& name) {
  auto [t, b] = lookup(name);
  return weight_vector(*t, b);
}

namespace {

struct Binder {
  const TensorLookup& lookup;
  Matrix matrix(const std::string& name) const { return lookup_matrix(lookup, name); }
  std::vector<float> floats(const std::string& name) const { return lookup_vector(lookup, name); }
  // norm ⊙ proj (both bf16 in the release: their product is exact in fp32)
  std::vector<float> score(const std::string& norm, const std::string& proj) const {
    auto n = floats(norm);
    auto p = floats(proj);
    if (n.size() != p.size()) fail("tensors {} and {} differ in size", norm, proj);
    for (size_t i = 0; i < n.size(); ++i) n[i] *= p[i];
    return n;
  }
};

}  // namespace

LayerWeights bind_layer(const ModelConfig& c, int layer, const TensorLookup& lookup) {
  Binder b{lookup};
  LayerWeights w;
  w.layer = layer;
  const std::string P = c.names.layer(layer);
  w.input_norm = b.floats(P + "input_layernorm.weight");
  w.post_norm = b.floats(P + "post_attention_layernorm.weight");
  if (c.residual == ResidualForm::kAttnRes) {
    w.attn_res_score =
        b.score(P + "self_attention_res_norm.weight", P + "self_attention_res_proj.weight");
    w.mlp_res_score = b.score(P + "mlp_res_norm.weight", P + "mlp_res_proj.weight");
  }
  const std::string A = P + "self_attn.";
  if (c.is_mla(layer)) {
    auto& m = w.mla;
    if (c.mla.q_lora_rank > 0) {
      m.q_a = b.matrix(A + "q_a_proj.weight");
      m.q_a_norm = b.floats(A + "q_a_layernorm.weight");
      m.q_b = b.matrix(A + "q_b_proj.weight");
    } else {
      m.q = b.matrix(A + "q_proj.weight");
    }
    m.kv_a = b.matrix(A + "kv_a_proj_with_mqa.weight");
    m.kv_a_norm = b.floats(A + "kv_a_layernorm.weight");
    m.kv_b = b.matrix(A + "kv_b_proj.weight");
    if (c.mla.output_gate) m.g = b.matrix(A + "g_proj.weight");
    m.o = b.matrix(A + "o_proj.weight");
  } else {
    auto& k = w.kda;
    k.q = b.matrix(A + "q_proj.weight");
    k.k = b.matrix(A + "k_proj.weight");
    k.v = b.matrix(A + "v_proj.weight");
    k.q_conv = b.floats(A + "q_conv1d.weight");
    k.k_conv = b.floats(A + "k_conv1d.weight");
    k.v_conv = b.floats(A + "v_conv1d.weight");
    k.f_a = b.matrix(A + "f_a_proj.weight");
    k.f_b = b.matrix(A + "f_b_proj.weight");
    k.dt_bias = b.floats(A + "dt_bias");
    // A_log: one value per head; entries past num_heads are padding and never read.
    auto a_log = b.floats(A + "A_log");
    if (static_cast<int64_t>(a_log.size()) < c.kda.num_heads) {
      fail("tensor {}A_log: {} entries, expected at least num_heads = {}", A, a_log.size(),
           c.kda.num_heads);
    }
    k.a_exp.resize(static_cast<size_t>(c.kda.num_heads));
    for (int64_t h = 0; h < c.kda.num_heads; ++h) k.a_exp[h] = std::exp(a_log[h]);
    k.b = b.matrix(A + "b_proj.weight");
    if (c.kda.low_rank_output_gate) {
      k.g_a = b.matrix(A + "g_a_proj.weight");
      k.g = b.matrix(A + "g_b_proj.weight");
    } else {
      k.g = b.matrix(A + "g_proj.weight");
    }
    k.o_norm = b.floats(A + "o_norm.weight");
    k.o = b.matrix(A + "o_proj.weight");
  }
  if (c.is_dense(layer)) {
    w.dense.gate = b.matrix(P + "mlp.gate_proj.weight");
    w.dense.up = b.matrix(P + "mlp.up_proj.weight");
    w.dense.down = b.matrix(P + "mlp.down_proj.weight");
  } else {
    auto& m = w.moe;
    const std::string M = c.names.moe(layer);
    m.router = b.matrix(M + "gate.weight");
    m.score_bias = b.floats(M + "gate.e_score_correction_bias");
    if (c.moe.flavour == MoeFlavour::kLatent) {
      m.down = b.matrix(M + "routed_expert_down_proj.weight");
      if (c.moe.latent_norm) m.latent_norm = b.floats(M + "routed_expert_norm.weight");
      m.up = b.matrix(M + "routed_expert_up_proj.weight");
    }
    if (c.moe.num_shared_experts > 0) {
      m.shared.gate = b.matrix(M + "shared_experts.gate_proj.weight");
      m.shared.up = b.matrix(M + "shared_experts.up_proj.weight");
      m.shared.down = b.matrix(M + "shared_experts.down_proj.weight");
    }
  }
  return w;
}

HeadWeights bind_head(const ModelConfig& c, const TensorLookup& lookup) {
  Binder b{lookup};
  HeadWeights h;
  h.lm_head = b.matrix(c.tie_embeddings ? c.names.embed() : c.names.lm_head());
  h.final_norm = b.floats(c.names.final_norm());
  if (c.residual == ResidualForm::kAttnRes) {
    h.out_res_score = b.score("language_model.model.output_attn_res_norm.weight",
                              "language_model.model.output_attn_res_proj.weight");
  }
  return h;
}

std::vector<std::string> head_tensors(const ModelConfig& c) {
  std::vector<std::string> names = {c.tie_embeddings ? c.names.embed() : c.names.lm_head(),
                                    c.names.final_norm()};
  if (c.residual == ResidualForm::kAttnRes) {
    names.push_back("language_model.model.output_attn_res_norm.weight");
    names.push_back("language_model.model.output_attn_res_proj.weight");
  }
  return names;
}

std::vector<std::string> router_tensors(const ModelConfig& c, int layer) {
  return {c.names.moe(layer) + "gate.weight",
          c.names.layer(layer) + "post_attention_layernorm.weight",
          c.names.moe(layer) + "gate.e_score_correction_bias"};
}

RouterWeights bind_router(const ModelConfig& c, int layer, const TensorLookup& lookup) {
  Binder b{lookup};
  auto names = router_tensors(c, layer);
  RouterWeights r;
  r.router = b.matrix(names[0]);
  r.post_norm = b.floats(names[1]);
  r.score_bias = b.floats(names[2]);
  return r;
}

uint64_t int8_bytes(int64_t rows, int64_t cols) {
  return static_cast<uint64_t>(rows * cols + rows * 2);
}

Matrix quantize_int8(const Matrix& m, std::vector<uint8_t>& storage) {
  storage.resize(int8_bytes(m.rows, m.cols));
  int8_t* q = reinterpret_cast<int8_t*>(storage.data());
  uint8_t* scales = storage.data() + m.rows * m.cols;
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    float amax = 0;
    for (int64_t k = 0; k < m.cols; ++k) {
      row[k] = matrix_element(m, r, k);
      amax = std::max(amax, std::fabs(row[k]));
    }
    // The scale is rounded to f16 first so quantisation uses the value the kernels will.
    const uint16_t sh = f32_to_f16(amax > 0 ? amax / 127.0f : 1.0f);
    const float s = f16_to_f32(sh);
    std::memcpy(scales + 2 * r, &sh, 2);
    for (int64_t k = 0; k < m.cols; ++k) {
      float v = std::nearbyint(row[k] / s);
      q[r * m.cols + k] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
  Matrix out;
  out.format = WeightFormat::kInt8;
  out.rows = m.rows;
  out.cols = m.cols;
  out.data = storage.data();
  out.scales = scales;
  return out;
}

namespace {
void quantize_into(Matrix& m, std::vector<std::vector<uint8_t>>& storage) {
  if (!m.valid() || m.format != WeightFormat::kBF16) return;
  storage.emplace_back();
  m = quantize_int8(m, storage.back());
}
}  // namespace

void quantize_layer_int8(LayerWeights& w, std::vector<std::vector<uint8_t>>& st) {
  for (Matrix* m :
       {&w.kda.q,    &w.kda.k,      &w.kda.v,           &w.kda.f_a,       &w.kda.f_b,
        &w.kda.b,    &w.kda.g,      &w.kda.g_a,         &w.kda.o,         &w.mla.q,
        &w.mla.q_a,  &w.mla.q_b,    &w.mla.kv_a,        &w.mla.kv_b,      &w.mla.g,
        &w.mla.o,    &w.dense.gate, &w.dense.up,        &w.dense.down,    &w.moe.router,
        &w.moe.down, &w.moe.up,     &w.moe.shared.gate, &w.moe.shared.up, &w.moe.shared.down}) {
    quantize_into(*m, st);
  }
}

void quantize_head_int8(HeadWeights& w, std::vector<std::vector<uint8_t>>& st) {
  quantize_into(w.lm_head, st);
}

}  // namespace deltafin
