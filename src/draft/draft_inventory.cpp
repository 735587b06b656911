// The release layouts of docs/DRAFT-MODELS.md, written once: the loader's tensor check,
// make-model's writer and doctor's size estimate all read this list.
#include "draft/draft_inventory.h"

#include <fmt/format.h>

#include <algorithm>

#include "tensor/dtype.h"

namespace deltafin {

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

uint64_t draft_weight_bytes(const DraftModelConfig& c, bool with_embeddings) {
  uint64_t bytes = 0;
  for (const ExpectedTensor& t : draft_tensors(c)) {
    if (!with_embeddings && t.name == "embed_tokens.weight") continue;
    uint64_t n = dtype_size(t.dtype);
    for (const int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    bytes += n;
  }
  return bytes;
}

DraftModelConfig eagle31_shape(const ModelConfig& target) {
  DraftModelConfig d;
  d.kind = DraftKind::kEagle3;
  d.hidden = target.hidden;
  d.intermediate = 2 * target.hidden;
  d.num_layers = 1;
  d.vocab = target.vocab;
  d.mla = target.mla;
  d.mla.output_gate = false;
  d.max_positions = target.max_positions;
  const int n = static_cast<int>(target.num_layers);
  d.taps.layers = {std::min(1, n - 1), n / 2, std::max(0, n - 2)};
  d.taps.layers.erase(std::unique(d.taps.layers.begin(), d.taps.layers.end()), d.taps.layers.end());
  d.fc_norm = true;
  d.norm_output = true;
  return d;
}

}  // namespace deltafin
