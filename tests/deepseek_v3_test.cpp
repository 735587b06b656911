// The DeepSeek-V3 architecture as Kimi K2 (FP8), K2-Thinking (INT4 experts), K2.5's text model
// and DeepSeek-V3 (FP8, grouped router, MTP layer) release it (docs/FAMILY.md "DeepSeek-V3 and
// Kimi K2"): the config parser's choices and checks for every release layout, the grouped router
// and the YaRN tables against the document's worked values, the inventory's quantised tensors
// (block scales, INT4 triples, the ignored rotary tables), and `make-model --preset k2 | k2-int4 |
// deepseek-v3` models through the real binary — expert streaming under the minimum budget equals
// the mapped run bit for bit, a state snapshot continues bit for bit, and inspect names them. The
// float64 goldens (tests/data/k2-tiny, k2-int4-tiny, k25-tiny, deepseek-v3-tiny) run in
// golden_test.cpp, drafting in speculative_cli_test.cpp, prefix snapshots in prefix_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/layers.h"
#include "model/rope.h"
#include "prefix/prefix_store.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/plan.h"
#include "streaming_util.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

std::string golden_model(const std::string& name) {
  return test::data_dir() + "/" + name + "/model";
}

json config_of(const std::string& name) {
  return json::parse(test::slurp(golden_model(name) + "/config.json"));
}

std::string config_error(const json& j) {
  try {
    parse_config(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeepseekV3Config, EveryReleaseLayoutChoosesTheFamilysComponents) {
  for (const char* name : {"k2-tiny", "k2-int4-tiny", "k25-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_config(golden_model(name));
    const std::string n = name;
    EXPECT_EQ(c.family, Family::kDeepseekV3);
    EXPECT_EQ(c.activation, Activation::kSiLU);
    EXPECT_EQ(c.residual, ResidualForm::kPreNorm);
    EXPECT_EQ(c.moe.flavour, MoeFlavour::kPlain);
    EXPECT_FALSE(c.mla.output_gate);
    EXPECT_TRUE(c.mla.rope.enabled);
    EXPECT_FLOAT_EQ(c.mla.latent_eps, 1e-6f);
    EXPECT_EQ(c.num_mla_layers(), c.num_layers);
    EXPECT_EQ(c.mla.q_lora_rank, 160);
    EXPECT_EQ(c.mla.qk_rope_dim, 16);
    EXPECT_EQ(c.expert_dim(), c.hidden);
    EXPECT_EQ(c.moe.num_shared_experts, 1);
    EXPECT_TRUE(c.moe.renormalize);
    EXPECT_EQ(c.mla.rope.original_max_positions, 4096);
    const std::string P = n == "k25-tiny" ? "language_model." : "";
    EXPECT_EQ(c.names.embed(), P + "model.embed_tokens.weight");
    EXPECT_EQ(c.names.lm_head(), P + "lm_head.weight");
    EXPECT_EQ(c.names.expert(1, 7), P + "model.layers.1.mlp.experts.7.");
    if (n == "deepseek-v3-tiny") {
      EXPECT_EQ(c.model_type, "deepseek_v3");
      EXPECT_EQ(c.moe.num_groups, 4);
      EXPECT_EQ(c.moe.topk_groups, 2);
      EXPECT_EQ(c.first_k_dense, 2);
      EXPECT_EQ(c.mtp_layers, 1);
      EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 2.5f);
      EXPECT_EQ(c.mla.rope.theta, 10000.0);
      EXPECT_EQ(c.mla.rope.factor, 40.0);
      EXPECT_EQ(c.mla.rope.beta_fast, 32.0);
      EXPECT_EQ(c.bos_token_id, 0);
      EXPECT_EQ(c.eos_token_id, 1);
    } else {
      EXPECT_EQ(c.model_type, n == "k25-tiny" ? "kimi_k25" : "kimi_k2");
      EXPECT_EQ(c.moe.num_groups, 1);
      EXPECT_EQ(c.first_k_dense, 1);
      EXPECT_EQ(c.mtp_layers, 0);
      EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 2.827f);
      EXPECT_EQ(c.mla.rope.theta, 50000.0);
      EXPECT_EQ(c.mla.rope.factor, 64.0);
      EXPECT_EQ(c.mla.rope.beta_fast, 1.0);
    }
    EXPECT_FLOAT_EQ(c.rms_eps, n == "k25-tiny" ? 1e-5f : 1e-6f);
    const bool fp8 = n == "k2-tiny" || n == "deepseek-v3-tiny";
    EXPECT_EQ(c.fp8_trunk, fp8);
    EXPECT_EQ(c.expert_format(), fp8 ? ExpertFormat::kFP8 : ExpertFormat::kInt4);
  }
}

TEST(DeepseekV3Config, BadValuesAreErrorsNamingTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"n_group", 3, "n_group (3) must divide n_routed_experts (16)"},
      {"topk_group", 5, "topk_group (5) exceeds n_group (4)"},
      {"num_experts_per_tok", 9, "num_experts_per_tok (9) exceeds the experts of the 2 groups"},
      {"hidden_act", "gelu", "hidden_act: expected \"silu\""},
      {"scoring_func", "softmax", "scoring_func: expected \"sigmoid\""},
      {"topk_method", "greedy", "topk_method: expected \"noaux_tc\""},
      {"num_nextn_predict_layers", 2, "num_nextn_predict_layers: expected 0 or 1"},
      {"moe_layer_freq", 2, "moe_layer_freq: expected 1"},
      {"qk_rope_head_dim", 15, "qk_rope_head_dim: expected an even number"},
      {"num_key_value_heads", 2, "num_key_value_heads (2) must equal num_attention_heads (4)"},
      {"attention_bias", true, "attention_bias: expected false"},
      {"model_type", "kimi_k3", "model_type: expected \"kimi_k2\" or \"deepseek_v3\""},
      {"attn_res_block_size", 4, "attn_res_block_size: a K3 / Kimi-Linear field"},
      {"mla_use_nope", true, "mla_use_nope: a K3 / Kimi-Linear field"},
      {"rope_theta", "big", "rope_theta: expected a number"},
      {"rms_norm_eps", 0.0, "rms_norm_eps: expected a positive number"},
      {"first_k_dense_replace", 9, "first_k_dense_replace (9) exceeds num_hidden_layers (3)"},
  };
  for (const auto& k : cases) {
    json j = config_of("deepseek-v3-tiny");
    j[k.field] = k.value;
    const std::string e = config_error(j);
    EXPECT_NE(e.find("invalid DeepSeek-V3 / Kimi K2 config"), std::string::npos)
        << k.field << ": " << e;
    EXPECT_NE(e.find(k.expect), std::string::npos) << k.field << ": " << e;
  }
  struct Nested {
    std::vector<std::string> path;
    json value;
    const char* expect;
  };
  const std::vector<Nested> nested = {
      {{"rope_scaling", "type"}, "linear", "rope_scaling.type: expected \"yarn\""},
      {{"rope_scaling", "factor"}, 0.5, "rope_scaling.factor: expected a number >= 1"},
      {{"quantization_config", "quant_method"}, "awq", "quantization_config.quant_method"},
      {{"quantization_config", "fmt"}, "e5m2", "quantization_config.fmt: expected \"e4m3\""},
      {{"quantization_config", "weight_block_size"},
       {64, 64},
       "quantization_config.weight_block_size: expected [128, 128]"},
      {{"quantization_config", "activation_scheme"},
       "static",
       "quantization_config.activation_scheme: expected \"dynamic\""},
  };
  for (const auto& k : nested) {
    json j = config_of("deepseek-v3-tiny");
    j[k.path[0]][k.path[1]] = k.value;
    const std::string e = config_error(j);
    EXPECT_NE(e.find(k.expect), std::string::npos) << k.path[1] << ": " << e;
  }
  // The INT4 scheme, field by field (K2-Thinking's config).
  const std::vector<std::pair<std::string, json>> int4 = {
      {"num_bits", 8},      {"type", "float"},       {"group_size", 128},
      {"symmetric", false}, {"strategy", "channel"}, {"actorder", "group"}};
  for (const auto& [field, value] : int4) {
    json j = config_of("k2-int4-tiny");
    j["quantization_config"]["config_groups"]["group_0"]["weights"][field] = value;
    const std::string e = config_error(j);
    EXPECT_NE(e.find("quantization_config.config_groups.group_0.weights." + field),
              std::string::npos)
        << field << ": " << e;
  }
  json j = config_of("k2-int4-tiny");
  j["quantization_config"]["format"] = "float-quantized";
  EXPECT_NE(config_error(j).find("quantization_config.format: expected \"pack-quantized\""),
            std::string::npos)
      << config_error(j);
  j = config_of("k2-int4-tiny");
  j["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  EXPECT_NE(config_error(j).find("input_activations: expected null"), std::string::npos);
  // K2.5: the nested text_config's fields are named with their path, and the top level must agree.
  j = config_of("k25-tiny");
  j["text_config"]["n_routed_experts"] = "many";
  EXPECT_NE(config_error(j).find("text_config.n_routed_experts: expected an integer"),
            std::string::npos)
      << config_error(j);
  j = config_of("k25-tiny");
  j["eos_token_id"] = 7;
  EXPECT_NE(config_error(j).find("eos_token_id: the top level (7) and text_config"),
            std::string::npos)
      << config_error(j);
  j = config_of("k25-tiny");
  j.erase("text_config");
  EXPECT_NE(config_error(j).find("text_config: missing"), std::string::npos);
  j = config_of("k25-tiny");
  j["model_type"] = "kimi_k3";
  EXPECT_NE(config_error(j).find("model_type: expected \"kimi_k25\""), std::string::npos);
  // A plain (unscaled) RoPE config loads: no rope_scaling, the softmax scale 1/sqrt(qk).
  j = config_of("k2-tiny");
  j.erase("rope_scaling");
  const ModelConfig c = parse_config(j.dump(), "config.json");
  EXPECT_EQ(c.mla.rope.factor, 1.0);
  EXPECT_FLOAT_EQ(mla_softmax_scale(c.mla), 1.0f / std::sqrt(48.0f));
}

// docs/FAMILY.md §RoPE's worked values at the releases' sizes (64 rope dims).
TEST(DeepseekV3Rope, YarnTablesAndScalesAreTheDocumentsValues) {
  RopeConfig r;
  r.enabled = true;
  r.theta = 10000.0;
  r.factor = 40.0;
  r.original_max_positions = 4096;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  Rope ds(r, 64);
  for (int i = 0; i < 32; ++i) {
    const double base = 1.0 / std::pow(10000.0, 2.0 * i / 64.0);
    if (i <= 10) {
      EXPECT_EQ(ds.inv_freq()[i], base) << i;  // low 10: unscaled
    }
    if (i >= 23) {
      EXPECT_NEAR(ds.inv_freq()[i], base / 40.0, 1e-18) << i;  // high 23: / factor
    }
    if (i > 10 && i < 23) {
      EXPECT_LT(ds.inv_freq()[i], base) << i;
      EXPECT_GT(ds.inv_freq()[i], base / 40.0) << i;
    }
  }
  MlaConfig m;
  m.qk_nope_dim = 128;
  m.qk_rope_dim = 64;
  m.rope = r;
  EXPECT_NEAR(mla_softmax_scale(m), 0.135234, 5e-7);  // 192^-½ · (0.1 ln 40 + 1)²
  r.theta = 50000.0;
  r.factor = 64.0;
  r.beta_fast = r.beta_slow = 1.0;
  m.rope = r;
  EXPECT_NEAR(mla_softmax_scale(m), 0.144680, 5e-7);  // K2-0905
  Rope k2(r, 64);
  for (int i = 0; i < 32; ++i) {
    const double base = 1.0 / std::pow(50000.0, 2.0 * i / 64.0);
    if (i <= 19) {
      EXPECT_EQ(k2.inv_freq()[i], base) << i;
    }
    if (i >= 20) {
      EXPECT_NEAR(k2.inv_freq()[i], base / 64.0, 1e-18) << i;
    }
  }
  // Interleaved pairs: (x0, x1) rotated by position · inv_freq[0], nothing else moved at p = 0.
  float x[64];
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i + 1);
  k2.rotate(x, 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(x[i], static_cast<float>(i + 1));
  k2.rotate(x, 3);  // pair 0 at angle 3 (inv_freq[0] = 1)
  EXPECT_FLOAT_EQ(x[0], static_cast<float>(1 * std::cos(3.0) - 2 * std::sin(3.0)));
  EXPECT_FLOAT_EQ(x[1], static_cast<float>(1 * std::sin(3.0) + 2 * std::cos(3.0)));
  // K3 (NoPE) keeps its scale bit for bit.
  MlaConfig k3;
  k3.qk_nope_dim = 128;
  k3.qk_rope_dim = 64;
  EXPECT_EQ(mla_softmax_scale(k3), 1.0f / std::sqrt(192.0f));
}

// docs/FAMILY.md §Router's rules on a hand-made row (the reference's self-check example).
TEST(DeepseekV3Router, TheGroupStepLimitsTheChoiceAndTiesGoLow) {
  const float logits[8] = {0.2f, -0.1f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const float bias[8] = {0.3f, 0.3f, 0.0f, 0.0f, 0.9f, -0.9f, 0.2f, 0.2f};
  int ids[3];
  float w[3];
  // Biased: [.850 .775 .5 .5 | 1.4 -.4 | .7 .7]; groups of 2, sums [1.625, 1.0, 1.0, 1.4]: groups
  // 0 and 3 are kept, so expert 4 (the best biased score) is out.
  route_row(logits, bias, 8, 2, true, 2.0f, 4, 2, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  const double s0 = 1 / (1 + std::exp(-0.2)), s1 = 1 / (1 + std::exp(0.1));
  EXPECT_NEAR(w[0], s0 / (s0 + s1) * 2.0, 1e-6);  // unbiased scores, renormalised, scaled
  EXPECT_NEAR(w[1], s1 / (s0 + s1) * 2.0, 1e-6);
  route_row(logits, bias, 8, 2, true, 2.0f, 1, 1, ids, w);  // no group step
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 4);
  // Equal groups and equal experts: the lower ids win.
  const float flat[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const float zero[8] = {};
  route_row(flat, zero, 8, 2, true, 1.0f, 4, 2, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  route_row(flat, zero, 8, 3, true, 1.0f, 4, 2, ids, w);  // two groups of two: 0, 1, 2
  EXPECT_EQ(ids[2], 2);
}

// The inventory of each release layout: FP8 block scales beside every FP8 linear, INT4 triples
// for routed experts (weight_shape I64 or I32), the MTP layer, the rotary tables and (K2.5) the
// vision tower ignored, and a missing scale named.
TEST(DeepseekV3Inventory, QuantisedTensorsAreCheckedAndNamed) {
  for (const char* name : {"k2-tiny", "k2-int4-tiny", "k25-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_config(golden_model(name));
    auto ck = Checkpoint::open(golden_model(name));
    const InventoryReport rep = check_inventory(c, ck->tensors(), ck->dir());
    EXPECT_EQ(rep.checked, ck->tensors().size());
    TensorTable t = ck->tensors();
    const std::string P = c.names.layer(0) + "self_attn.";
    TensorInfo extra = t.at(P + "kv_a_layernorm.weight");
    extra.name = P + "rotary_emb.inv_freq";
    t[extra.name] = extra;
    if (c.names.prefix == "language_model.") {
      extra.name = "vision_tower.patch_embed.proj.weight";
      t[extra.name] = extra;
    }
    EXPECT_EQ(check_inventory(c, t, ck->dir()).ignored, c.names.prefix.empty() ? 1u : 2u);
    if (c.fp8_trunk) {
      const std::string scale = P + "kv_b_proj.weight_scale_inv";
      EXPECT_EQ(t.at(scale).shape, (std::vector<int64_t>{2, 2}));  // [256, 144]: ragged columns
      t.erase(scale);
      try {
        check_inventory(c, t, ck->dir());
        ADD_FAILURE() << "a missing block scale was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing (1):\n    " + scale), std::string::npos)
            << e.what();
      }
    } else {
      const std::string shape = c.names.expert(1, 3) + "down_proj.weight_shape";
      EXPECT_EQ(t.at(shape).dtype, DType::kI64);
      t.at(shape).dtype = DType::kI32;  // as compressed-tensors declares it
      t.at(shape).nbytes = 8;
      EXPECT_NO_THROW(check_inventory(c, t, ck->dir()));
      t.erase(c.names.expert(1, 3) + "up_proj.weight_scale");
      try {
        check_inventory(c, t, ck->dir());
        ADD_FAILURE() << "a missing INT4 scale was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(c.names.expert(1, 3) + "up_proj.weight_scale"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

// Every DeepSeek-V3 preset's config is a valid config of its release kind.
TEST(DeepseekV3Preset, EveryPresetsConfigParses) {
  for (const char* preset : {"k2", "k2-int4", "k25", "deepseek-v3"}) {
    SCOPED_TRACE(preset);
    const SyntheticSpec s = synthetic_preset(preset);
    const ModelConfig c = parse_config(synthetic_config_json(s), "config.json");
    EXPECT_EQ(c.family, Family::kDeepseekV3);
    EXPECT_EQ(c.hidden, 7168);
    EXPECT_EQ(c.mla.kv_lora_rank, 512);
    EXPECT_EQ(c.moe.intermediate, 2048);
    const std::string p = preset;
    EXPECT_EQ(c.expert_format(),
              p == "k2" || p == "deepseek-v3" ? ExpertFormat::kFP8 : ExpertFormat::kInt4);
    EXPECT_EQ(c.names.prefix, p == "k25" ? "language_model." : "");
    EXPECT_EQ(c.mtp_layers, p == "deepseek-v3" ? 1 : 0);
    EXPECT_EQ(c.moe.num_groups, p == "deepseek-v3" ? 8 : 1);
  }
}

// `make-model --preset P`, shrunk so a test takes seconds (the release's heads and widths, hidden
// 256, 16 experts top-4, vocabulary 512).
std::string small_preset(const std::string& preset, const std::string& layers) {
  return test::shared_model({"--preset", preset, "--layers", layers, "--experts", "16", "--top-k",
                             "4", "--hidden", "256", "--vocab", "512", "--shard-size", "16M",
                             "--quiet"});
}

const std::string& small_k2() {
  static const std::string dir = small_preset("k2", "3");
  return dir;
}

// Streaming the experts under the minimum budget (each expert's image: its weights and, apart
// from them in the file, its scales) gives the mapped run's logits bit for bit.
void expect_streaming_equals_mmap(const std::string& dir, ExpertFormat format) {
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  EXPECT_EQ(check_inventory(c, ck->tensors(), ck->dir()).expert_format, format);
  EXPECT_FALSE(ExpertDirectory(c, *ck, format).location(c.first_k_dense, 0).contiguous());
  test::expect_minimum_budget_streaming_is_exact(dir, format);
}

TEST(DeepseekV3Preset, K2ExpertStreamingAtTheMinimumBudgetIsExact) {
  expect_streaming_equals_mmap(small_k2(), ExpertFormat::kFP8);
  auto r = test::run_deltafin({"inspect", "--model", small_k2()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Kimi K2 (DeepseekV3ForCausalLM)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("YaRN: theta 50000, factor 64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trunk linears FP8"), std::string::npos) << r.out;
}

TEST(DeepseekV3Preset, K2ThinkingInt4ExpertStreamingAtTheMinimumBudgetIsExact) {
  expect_streaming_equals_mmap(small_preset("k2-int4", "2"), ExpertFormat::kInt4);
}

TEST(DeepseekV3Preset, ARestoredSnapshotContinuesBitForBit) {
  auto model = open_model(small_k2());
  std::vector<int32_t> p;
  for (int i = 0; i < 45; ++i) p.push_back((i * 37 + 11) % 250);
  const size_t m = 21;
  State a = model->new_state();
  model->forward(a, std::span(p).first(m));
  PrefixStoreOptions o;
  o.dir = test::temp_dir("ds_prefix");
  o.disk_bytes = 1ull << 30;
  o.model_id = "test";
  PrefixStore disk(model->config(), o);
  disk.save(std::span(p).first(m), a, nullptr);
  const auto want = model->forward(a, std::span(p).subspan(m));
  State b = model->new_state();
  const Restored r = disk.restore(p, static_cast<int64_t>(p.size()) - 1, b, nullptr);
  ASSERT_EQ(r.position, static_cast<int64_t>(m));
  EXPECT_TRUE(r.from_disk);
  const auto got = model->forward(b, std::span(p).subspan(m));
  EXPECT_EQ(got, want) << "not bit-identical";
}

}  // namespace
}  // namespace deltafin
