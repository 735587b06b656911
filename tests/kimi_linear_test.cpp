// Kimi-Linear (KimiLinearForCausalLM, docs/FAMILY.md "Kimi-Linear"): the config parser's checks,
// the chunked KDA against the stepwise oracle with Kimi-Linear's unbounded decays (α underflowing
// to 0, subnormal, and ≈ 1 in one chunk), and a `make-model --preset kimi-linear` model through
// the real binary — it loads, its experts' tensors lie apart as the loader must allow, expert
// streaming under the minimum budget gives the in-RAM logits bit for bit, a state snapshot
// continues bit for bit, its tokenizer's K2 names give the stop ids, and `serve` answers the
// four official clients with tool calls, reusing its state across turns. The golden float64 case
// (tests/data/kimi-linear-tiny) runs in golden_test.cpp, drafting in speculative_cli_test.cpp,
// prefix snapshots in prefix_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "generate/generation_config.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/layers.h"
#include "prefix/prefix_store.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/plan.h"
#include "streaming_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

using nlohmann::json;

json tiny_config() {
  return json::parse(test::slurp(test::data_dir() + "/kimi-linear-tiny/model/config.json"));
}

std::string config_error(const json& j) {
  try {
    parse_config(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KimiLinearConfig, TheTinyReleaseLayoutConfigChoosesTheFamilysComponents) {
  const ModelConfig c = parse_config(tiny_config().dump(), "config.json");
  EXPECT_EQ(c.family, Family::kKimiLinear);
  EXPECT_EQ(c.activation, Activation::kSiLU);
  EXPECT_EQ(c.residual, ResidualForm::kPreNorm);
  EXPECT_EQ(c.moe.flavour, MoeFlavour::kPlain);
  EXPECT_EQ(c.kda.decay, KdaDecay::kSoftplus);
  EXPECT_TRUE(c.kda.low_rank_output_gate);
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_FALSE(c.mla.output_gate);
  EXPECT_EQ(c.names.embed(), "model.embed_tokens.weight");
  EXPECT_EQ(c.names.expert(3, 7), "model.layers.3.block_sparse_moe.experts.7.");
  EXPECT_EQ(c.expert_dim(), c.hidden);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 2.446f);
  EXPECT_TRUE(c.moe.renormalize);
  EXPECT_EQ(c.max_positions, 1048576);
  EXPECT_EQ(c.eos_token_id, 258);
  // Layers 3 and 6 (0-based) are MLA, the rest KDA; layer 0 is dense.
  for (int64_t i = 0; i < c.num_layers; ++i) EXPECT_EQ(c.is_mla(i), i == 3 || i == 6) << i;
  EXPECT_EQ(c.first_k_dense, 1);
  EXPECT_EQ(c.num_kda_layers(), 5);
  // One routed expert per token: no renormalisation (the reference's rule).
  json j = tiny_config();
  j["num_experts_per_token"] = 1;
  EXPECT_FALSE(parse_config(j.dump(), "config.json").moe.renormalize);
}

TEST(KimiLinearConfig, BadValuesAreErrorsNamingTheField) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"q_lora_rank", 64, "q_lora_rank: expected null"},
      {"mla_use_nope", false, "mla_use_nope: expected true"},
      {"hidden_act", "situ", "hidden_act: expected \"silu\""},
      {"moe_router_activation_func", "softmax", "moe_router_activation_func"},
      {"num_expert_group", 8, "num_expert_group: expected 1"},
      {"topk_group", 4, "topk_group: expected 1"},
      {"num_nextn_predict_layers", 1, "num_nextn_predict_layers: expected 0"},
      {"num_key_value_heads", 2, "num_key_value_heads (2) must equal num_attention_heads (4)"},
      {"model_type", "kimi_k3", "model_type: expected \"kimi_linear\""},
      {"attn_res_block_size", 4, "attn_res_block_size: a K3 field"},
      {"routed_expert_hidden_size", 64, "routed_expert_hidden_size: a K3 field"},
      {"text_config", json::object(), "text_config: a K3 field"},
      {"rms_norm_eps", -1.0, "rms_norm_eps: expected a positive number"},
      {"model_max_length", "long", "model_max_length: expected an integer"},
  };
  for (const auto& k : cases) {
    json j = tiny_config();
    j[k.field] = k.value;
    const std::string e = config_error(j);
    EXPECT_NE(e.find("invalid Kimi-Linear config"), std::string::npos) << k.field << ": " << e;
    EXPECT_NE(e.find(k.expect), std::string::npos) << k.field << ": " << e;
  }
  json j = tiny_config();
  j["linear_attn_config"]["gate_lower_bound"] = -5.0;
  EXPECT_NE(config_error(j).find("linear_attn_config.gate_lower_bound: a K3 field"),
            std::string::npos);
  j = tiny_config();
  j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 5};  // layer 6 in neither list
  EXPECT_NE(config_error(j).find("layer 6 (1-based) must appear in exactly one"), std::string::npos)
      << config_error(j);
  j = tiny_config();
  j.erase("moe_intermediate_size");
  EXPECT_NE(config_error(j).find("moe_intermediate_size: missing"), std::string::npos);
  // An architecture nobody implements is named.
  j = tiny_config();
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  const std::string e = config_error(j);
  EXPECT_NE(e.find("\"DeepseekV4ForCausalLM\""), std::string::npos) << e;
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
}

// A K3 tensor set handed over as Kimi-Linear (or the reverse) is refused by the inventory.
TEST(KimiLinearConfig, TheInventoryIsTheReleaseLayouts) {
  const ModelConfig c = parse_config(tiny_config().dump(), "config.json");
  const auto t = expected_tensors(c, {ExpertFormat::kBF16, 0});
  EXPECT_EQ(t.size(), 423u);  // docs/FAMILY.md KL.11
  int64_t params = 0;
  for (const auto& x : t) {
    int64_t n = 1;
    for (auto d : x.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(params, 1487092);
  auto ck = Checkpoint::open(test::data_dir() + "/kimi-linear-tiny/model");
  EXPECT_NO_THROW(check_inventory(c, ck->tensors(), ck->dir()));
}

// Kimi-Linear's decay −exp(A_log)·softplus(z) has no lower bound: within one 16-row window the
// decays here reach exactly 0, subnormals and values next to 1, in every channel pattern. The
// chunked form must stay finite and agree with the stepwise oracle to fp32 rounding.
TEST(KimiLinearKda, ChunkedFormIsFiniteAndExactWithUnboundedDecays) {
  for (const int T : {1, 5, 16, 17, 40}) {
    const int dk = 32, dv = 32;
    std::mt19937 rng(99 + T);
    std::normal_distribution<float> n01(0, 1);
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<float> q(T * dk), k(T * dk), v(T * dv), alpha(T * dk), beta(T);
    auto l2 = [&](float* x, float scale) {
      double s = 0;
      for (int d = 0; d < dk; ++d) s += x[d] * x[d];
      for (int d = 0; d < dk; ++d) x[d] = static_cast<float>(x[d] / std::sqrt(s + 1e-6) * scale);
    };
    for (int t = 0; t < T; ++t) {
      for (int d = 0; d < dk; ++d) {
        q[t * dk + d] = n01(rng);
        k[t * dk + d] = n01(rng);
        v[t * dv + d] = n01(rng);
        // The tiny checkpoint's ranges: exp(A_log) up to 16, dt_bias up to 14 (steep), down to
        // −9 (long memory), z ~ N(0, 1.5).
        // Channel kinds: α = 0 (g < −104), subnormal α (g in (−104, −87)), α ≈ 1, the rest.
        const int kind = d % 8;
        const float a = kind == 0 || kind == 1 ? 16.0f : kind == 5 ? 8.0f : 0.3f + 7.7f * u(rng);
        const float z = kind == 1   ? 8.0f + 6.0f * u(rng)
                        : kind == 5 ? 11.2f + 1.6f * u(rng)
                        : kind == 2 ? -9.0f + 3.0f * u(rng)
                                    : 1.5f * n01(rng);
        const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
        alpha[t * dk + d] = std::exp(-a * softplus);
      }
      l2(&q[t * dk], 1.0f / std::sqrt(static_cast<float>(dk)));
      l2(&k[t * dk], 1.0f);
      beta[t] = 1.0f / (1.0f + std::exp(-n01(rng)));
    }
    int zeros = 0, subnormal = 0;
    for (float a : alpha) {
      zeros += a == 0.0f;
      subnormal += std::fpclassify(a) == FP_SUBNORMAL;
    }
    EXPECT_GT(zeros, 0) << "the test must reach decays that underflow to 0";
    EXPECT_GT(subnormal, 0) << "and decays below float's smallest normal";
    std::vector<float> S0(dk * dv);
    for (auto& x : S0) x = 0.1f * n01(rng);
    std::vector<float> S_step = S0, S_chunk = S0, o_step(T * dv), o_chunk(T * dv), e(dv);
    for (int t = 0; t < T; ++t) {
      kda_step_head(S_step.data(), dk, dv, &q[t * dk], &k[t * dk], &v[t * dv], &alpha[t * dk],
                    beta[t], e.data(), &o_step[t * dv]);
    }
    kda_chunk_head(S_chunk.data(), dk, dv, T, q.data(), k.data(), v.data(), alpha.data(),
                   beta.data(), dk, dk, 1, o_chunk.data(), dv);
    double worst_o = 0, worst_s = 0;
    for (size_t i = 0; i < o_chunk.size(); ++i) {
      ASSERT_TRUE(std::isfinite(o_chunk[i])) << "T " << T << " row " << i / dv;
      worst_o = std::max(worst_o, static_cast<double>(std::fabs(o_chunk[i] - o_step[i])));
    }
    for (size_t i = 0; i < S_chunk.size(); ++i) {
      ASSERT_TRUE(std::isfinite(S_chunk[i])) << "T " << T;
      worst_s = std::max(worst_s, static_cast<double>(std::fabs(S_chunk[i] - S_step[i])));
    }
    EXPECT_LT(worst_o, 2e-5) << "T " << T;
    EXPECT_LT(worst_s, 2e-5) << "T " << T;
  }
}

// `make-model --preset kimi-linear`, shrunk so the test takes seconds (the release's head
// counts and widths, hidden 256, 4 layers, 16 experts, vocabulary 512).
const std::string& small_kimi_linear() {
  static const std::string dir = test::shared_model(
      {"--preset", "kimi-linear", "--layers", "4", "--experts", "16", "--top-k", "4", "--hidden",
       "256", "--vocab", "512", "--shard-size", "3M", "--quiet"});
  return dir;
}

TEST(KimiLinearPreset, LoadsWithItsExpertsTensorsApart) {
  const std::string& dir = small_kimi_linear();
  const ModelConfig c = load_config(dir);
  EXPECT_EQ(c.family, Family::kKimiLinear);
  EXPECT_EQ(c.num_mla_layers(), 1);
  EXPECT_EQ(c.kda.num_heads, 32);
  EXPECT_EQ(c.kda.head_dim, 128);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  auto ck = Checkpoint::open(dir);
  EXPECT_NO_THROW(check_inventory(c, ck->tensors(), ck->dir()));
  ExpertDirectory experts(c, *ck, ExpertFormat::kBF16);
  int split_across_shards = 0;
  for (int l = 1; l < 4; ++l) {
    for (int e = 0; e < 16; ++e) {
      const ExpertLocation& loc = experts.location(l, e);
      EXPECT_FALSE(loc.contiguous()) << l << " " << e;
      split_across_shards += loc.ranges.front().shard != loc.ranges.back().shard;
    }
  }
  EXPECT_GT(split_across_shards, 0) << "some expert's tensors should sit in different shards";
  auto r = test::run_deltafin({"inspect", "--model", dir});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Kimi-Linear (KimiLinearForCausalLM)"), std::string::npos) << r.out;
}

TEST(KimiLinearPreset, ExpertStreamingAtTheMinimumBudgetIsExact) {
  test::expect_minimum_budget_streaming_is_exact(small_kimi_linear(), ExpertFormat::kBF16);
}

TEST(KimiLinearPreset, ARestoredSnapshotContinuesBitForBit) {
  auto model = open_model(small_kimi_linear());
  std::vector<int32_t> p;
  for (int i = 0; i < 45; ++i) p.push_back((i * 37 + 11) % 250);
  const size_t m = 21;
  State a = model->new_state();
  model->forward(a, std::span(p).first(m));
  PrefixStoreOptions o;
  o.dir = test::temp_dir("kl_prefix");
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

// Its tokenizer names the special slots as K2 does; the stop ids come from the model's own config
// and tokenizer (<|im_end|>), not from K3's names.
TEST(KimiLinearPreset, TokenizerHasK2NamesAndTheStopIdsAreTheModels) {
  const std::string& dir = small_kimi_linear();
  const Tokenizer tok = Tokenizer::load(dir);
  const ModelConfig c = load_config(dir);
  ASSERT_TRUE(tok.special_id("<|im_end|>").has_value());
  EXPECT_EQ(*tok.special_id("<|im_end|>"), c.eos_token_id);
  EXPECT_EQ(*tok.special_id("<|im_user|>"), tok.n_ranks() + 3);
  EXPECT_EQ(*tok.special_id("<|im_middle|>"), tok.n_ranks() + 17);
  EXPECT_FALSE(tok.special_id("<|end_of_msg|>").has_value());
  EXPECT_EQ(stop_ids_for(c, &tok, {}), std::vector<int32_t>{static_cast<int32_t>(c.eos_token_id)});
  // The folder speaks Kimi-Linear's chat format (config.json's architecture decides it), whose
  // turns end at <|im_end|> (and [EOS]).
  EXPECT_EQ(tok.chat_format(), ChatFormat::kimi_linear);
  EXPECT_EQ(chat_stop_ids(tok),
            (std::vector<int32_t>{*tok.special_id("<|im_end|>"), *tok.special_id("[EOS]")}));
}

// Kimi-Linear through the four official clients: tool calls in each API's shape and second
// turns that restore the KDA + MLA snapshot at the end of the first request's messages and
// prefill only what the client added; answers equal to a server that reuses nothing.
TEST(KimiLinearPreset, EveryClientCallsToolsAndContinuesFromTheKeptState) {
  test::expect_family_clients_reuse_state(small_kimi_linear(), "kimi-linear");
}

}  // namespace
}  // namespace deltafin
