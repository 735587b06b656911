// Other shapes than the golden ones: synthetic checkpoints (make-model) with different sizes,
// layer schedules, block sizes, expert counts, top-k, scaling, SiTU betas, dense-layer counts
// and expert formats, each checked against the independent float64 reference in prefill, decode
// and split modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "model/model.h"
#include "reference_model.h"
#include "test_util.h"

namespace deltafin {
namespace {

struct Variant {
  const char* name;
  SyntheticSpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  SyntheticSpec base = synthetic_preset("tiny");
  base.hidden = 128;
  base.vocab = 512;
  base.layers = 5;
  base.experts = 12;
  base.top_k = 3;
  base.dense_intermediate = 256;
  {
    SyntheticSpec s = base;  // default schedule (MLA at 4, 5), block 2, heavier scaling
    s.attn_res_block = 2;
    s.routed_scaling = 2.5;
    v.push_back({"block2_scaling2p5", s});
  }
  {
    SyntheticSpec s = base;  // no dense layer, MLA first, odd block, other betas, bf16 experts
    s.first_k_dense = 0;
    s.mla_layers = {1, 3};
    s.attn_res_block = 4;
    s.situ_beta = 3.0;
    s.situ_linear_beta = 10.0;
    s.expert_format = ExpertFormat::kBF16;
    s.kda_heads = 12;  // more heads than head_dim: A_log holds num_heads entries
    s.kda_head_dim = 8;
    v.push_back({"nodense_mlafirst_bf16", s});
  }
  {
    SyntheticSpec s = base;  // two dense layers, all KDA but the last, other head shapes
    s.first_k_dense = 2;
    s.layers = 4;
    s.mla_layers = {4};
    s.kda_heads = 4;
    s.kda_head_dim = 16;
    s.mla_heads = 3;
    s.qk_nope = 16;
    s.qk_rope = 8;
    s.v_head = 24;
    s.kv_lora = 64;
    s.experts = 7;
    s.top_k = 7;
    s.shared_experts = 1;
    s.attn_res_block = 1;
    v.push_back({"twodense_block1_allexperts", s});
  }
  return v;
}

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

class Variants : public ::testing::TestWithParam<Variant> {};

TEST_P(Variants, MatchFloat64ReferenceInEveryMode) {
  const Variant& var = GetParam();
  std::string dir = test::temp_dir(var.name) + "/model";
  SyntheticSpec spec = var.spec;
  spec.tokenizer = false;
  make_model(dir, spec);
  test::ReferenceModel ref(dir);
  std::vector<int32_t> toks = {5, 17, 200, 3, 99, 42, 7, 255, 64, 128, 1, 250};
  auto expect = ref.logits(toks);
  auto model = open_model(dir);
  const int64_t V = model->config().vocab, T = static_cast<int64_t>(toks.size());
  for (int64_t split : {T, int64_t{0}, int64_t{5}}) {
    State st = model->new_state();
    std::vector<float> got;
    if (split > 0) got = model->forward(st, std::span<const int32_t>(toks.data(), split), true);
    for (int64_t t = split; t < T; ++t) {
      auto row = model->forward(st, std::span<const int32_t>(toks.data() + t, 1));
      got.insert(got.end(), row.begin(), row.end());
    }
    ASSERT_EQ(got.size(), expect.size());
    double mx = 0;
    for (size_t i = 0; i < got.size(); ++i) mx = std::max(mx, std::fabs(got[i] - expect[i]));
    EXPECT_LT(mx, 2e-3) << var.name << " split " << split;
    for (int64_t t = 0; t < T; ++t) {
      auto e = std::max_element(expect.begin() + t * V, expect.begin() + (t + 1) * V) -
               (expect.begin() + t * V);
      auto g =
          std::max_element(got.begin() + t * V, got.begin() + (t + 1) * V) - (got.begin() + t * V);
      EXPECT_EQ(e, g) << var.name << " split " << split << " position " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Variants, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return std::string(info.param.name); });

// Largest difference between the reference's logits and the golden float64 data.
double golden_gap(const test::ReferenceModel::Options& options) {
  test::ReferenceModel ref(test::data_dir() + "/k3-tiny-mxfp4/model", options);
  std::vector<int32_t> toks = {5, 17, 200, 3, 99};
  auto got = ref.logits(toks);
  std::string raw = test::slurp(test::data_dir() + "/k3-tiny-mxfp4/logits.f32");
  double mx = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float e;
    std::memcpy(&e, raw.data() + 4 * i, 4);
    mx = std::max(mx, std::fabs(got[i] - e));
  }
  return mx;
}

TEST(Reference, AgreesWithGoldenLogits) {
  // The reference itself is checked against the golden float64 data.
  EXPECT_LT(golden_gap({}), 1e-4);
}

TEST(Reference, PerChannelALogReadingFailsTheGoldenCase) {
  // The reference system reads A_log per channel; that runs without error but is another model,
  // and the golden data must tell them apart.
  test::ReferenceModel::Options wrong;
  wrong.a_log_per_channel = true;
  EXPECT_GT(golden_gap(wrong), 2e-3);
}

}  // namespace
}  // namespace deltafin
