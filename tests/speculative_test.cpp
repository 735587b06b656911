// Speculative decoding must never change greedy output: the completion with a drafter equals
// the plain one token for token. Random-weight models never repeat themselves, so a replay
// drafter proposes the known continuation with injected mistakes to reach the fully accepted,
// partly accepted and all rejected cases.
#include "generate/speculative.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "generate/driver.h"
#include "greedy_util.h"
#include "model/config.h"
#include "model/model.h"
#include "replay_drafter.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using test::ReplayDrafter;

TEST(Speculative, NgramProposesWhatFollowedTheLongestMatch) {
  NgramDrafter d(1, 3);
  const std::vector<int32_t> h = {7, 1, 2, 3, 9, 9, 1, 2, 3};
  EXPECT_EQ(d.propose(h, 2).tokens, (std::vector<int32_t>{9, 9}));
  EXPECT_TRUE(d.propose(std::vector<int32_t>{1, 2, 3}, 4).tokens.empty());
}

TEST(Speculative, BadDrafterAndDraftMaxAreRejected) {
  EXPECT_THROW(make_drafter("eagle"), InvalidArgument);
  EXPECT_EQ(make_drafter("none"), nullptr);
  EXPECT_NE(make_drafter("ngram"), nullptr);
  EXPECT_THROW(DraftMax::parse("0"), InvalidArgument);
  EXPECT_THROW(DraftMax::parse("-3"), InvalidArgument);
  EXPECT_THROW(DraftMax::parse("257"), InvalidArgument);
  EXPECT_THROW(DraftMax::from_count(-1), InvalidArgument);
  EXPECT_EQ(DraftMax::parse("1").max, 1);
  EXPECT_TRUE(DraftMax::parse("auto").automatic);
  EXPECT_EQ(DraftMax::parse("auto").max, kAutoDraftMax);
  EXPECT_TRUE(DraftMax::from_count(0).automatic);
  EXPECT_EQ(DraftMax::from_count(5).max, 5);
}

TEST(Speculative, GreedyOutputIsIdenticalWithDrafting) {
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16"}) {
    auto model = open_model(test::data_dir() + "/" + name + "/model");
    const int32_t vocab = static_cast<int32_t>(model->config().vocab);
    for (const std::vector<int32_t>& prompt :
         {std::vector<int32_t>{3, 1, 4, 1, 5}, std::vector<int32_t>{2, 7, 2, 7, 2, 7, 2}}) {
      State ps = model->new_state();
      const auto plain = test::generate_greedy(*model, ps, prompt, 24, {}, nullptr, 0);
      ASSERT_EQ(plain.size(), 24u);
      std::vector<int32_t> full = prompt;
      full.insert(full.end(), plain.begin(), plain.end());
      for (int wrong_every : {0, 3, 1}) {
        for (int k : {1, 4, 8}) {
          ReplayDrafter drafter(full, wrong_every, vocab);
          DraftStats st;
          State ss = model->new_state();
          const auto spec = test::generate_greedy(*model, ss, prompt, 24, {}, &drafter, k, &st);
          EXPECT_EQ(spec, plain) << name << " wrong_every=" << wrong_every << " k=" << k;
          if (wrong_every == 0) {
            EXPECT_EQ(st.accepted, st.proposed);
          }
          if (wrong_every == 1) {
            EXPECT_EQ(st.accepted, 0);
          }
          if (wrong_every == 0 && k > 1) {
            EXPECT_GT(st.tokens_per_pass(), 1.5);
          }
        }
      }
      NgramDrafter ngram;
      State ns = model->new_state();
      EXPECT_EQ(test::generate_greedy(*model, ns, prompt, 24, {}, &ngram, 4), plain) << name;
    }
  }
}

TEST(Speculative, StopTokenInsideAnAcceptedRunEndsThere) {
  auto model = open_model(test::data_dir() + "/k3-tiny-mxfp4/model");
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  State ps = model->new_state();
  const auto plain = test::generate_greedy(*model, ps, prompt, 16, {}, nullptr, 0);
  const std::vector<int32_t> stop = {plain[5]};
  State ps2 = model->new_state();
  const auto plain_stop = test::generate_greedy(*model, ps2, prompt, 16, stop, nullptr, 0);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  ReplayDrafter drafter(full, 0, static_cast<int32_t>(model->config().vocab));
  State ss = model->new_state();
  EXPECT_EQ(test::generate_greedy(*model, ss, prompt, 16, stop, &drafter, 8), plain_stop);
  State ms = model->new_state();
  ReplayDrafter d2(full, 0, static_cast<int32_t>(model->config().vocab));
  EXPECT_EQ(test::generate_greedy(*model, ms, prompt, 7, {}, &d2, 8),
            std::vector<int32_t>(plain.begin(), plain.begin() + 7));
}

TEST(Speculative, GreedyIdenticalOnAK3PresetModelAtTheMinimumBudget) {
  // A small `make-model --preset k3` shape (4 layers, 16 experts) so the test takes seconds;
  // the expert store at its minimum budget must give the same completion with drafting.
  const SyntheticSpec s = test::small_k3_spec();
  const std::string dir = test::temp_dir("speck3") + "/model";
  make_model(dir, s);
  auto c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions po;
  po.budget = 1ull << 40;
  po.shape.max_rows = 16;
  const uint64_t min_budget = plan_memory(c, *ck, po).min_working_set;
  const std::vector<int32_t> prompt = {11, 4, 9, 4, 9, 4};
  auto ram = open_model(dir);
  State rs = ram->new_state();
  const auto plain = test::generate_greedy(*ram, rs, prompt, 16, {}, nullptr, 0);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  EngineOptions eo = test::engine_options(dir);
  eo.memory_budget = min_budget;
  auto budgeted = open_model(eo, po.shape);
  for (int wrong_every : {0, 2}) {
    ReplayDrafter drafter(full, wrong_every, static_cast<int32_t>(s.vocab));
    State bs = budgeted->new_state();
    EXPECT_EQ(test::generate_greedy(*budgeted, bs, prompt, 16, {}, &drafter, 8), plain)
        << "wrong_every=" << wrong_every;
  }
}

// Through drive() and Generation (what run and chat use): greedy and seeded sampling give the
// same completion with and without drafting, since rows are sampled exactly as plain passes
// would be and a draft is accepted only when it equals the sampled token.
TEST(Speculative, DriveWithDraftingKeepsGreedyAndSeededSamplingOutput) {
  auto model = open_model(test::data_dir() + "/k3-tiny-mxfp4/model");
  const int32_t vocab = static_cast<int32_t>(model->config().vocab);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  for (float temperature : {0.0f, 0.8f}) {
    GenerationParams params;
    params.max_new_tokens = 20;
    params.sampling.temperature = temperature;
    params.sampling.top_k = 40;
    params.sampling.seed = 1234;
    params.sampling.has_seed = true;
    Generation plain(prompt, params, nullptr, vocab);
    State ps = model->new_state();
    drive(*model, ps, plain, nullptr, nullptr);
    const auto ids = plain.completion_ids();
    ASSERT_EQ(ids.size(), 20u);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), ids.begin(), ids.end());
    for (int wrong_every : {0, 3, 1}) {
      ReplayDrafter drafter(full, wrong_every, vocab);
      DraftConfig cfg;
      cfg.drafter = &drafter;
      cfg.max = 4;
      Generation spec(prompt, params, nullptr, vocab);
      State ss = model->new_state();
      drive(*model, ss, spec, nullptr, nullptr, &cfg);
      EXPECT_EQ(spec.completion_ids(), ids) << "T=" << temperature << " wrong=" << wrong_every;
      EXPECT_EQ(ss.position(), ps.position());
      if (wrong_every == 0) {
        EXPECT_EQ(cfg.stats.accepted, cfg.stats.proposed);
        EXPECT_LT(cfg.stats.target_passes, 10);
      }
      if (wrong_every == 1) {
        EXPECT_EQ(cfg.stats.accepted, 0);
      }
    }
  }
}

}  // namespace
}  // namespace deltafin
