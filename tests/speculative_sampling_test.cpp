// Sampling with drafting must keep the target's distribution. Thousands of seeded generations of
// the first three tokens on the tiny golden model, with drafters that are often wrong (a
// deterministic one, and one drawing from a synthetic q it reports), are compared with the
// exact joint distribution computed from the model's own logits by a chi-square test; the
// deterministic drafter must also give exactly the seeded plain tokens. The draft models
// (synthetic EAGLE-3.1, EAGLE-3 and DSpark folders for the same target) run through drive() on
// real passes, since their drafts depend on the target's taps. The draft-length choice is tested
// on its own: it may only change how much is verified, never what is emitted.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "draft/draft_model.h"
#include "draft/tap_drafter.h"
#include "engine/engine.h"
#include "fixtures/synthetic_draft.h"
#include "generate/draft_length.h"
#include "generate/driver.h"
#include "generate/speculative.h"
#include "greedy_util.h"
#include "model/model.h"
#include "test_util.h"

namespace deltafin {
namespace {

constexpr int kTopK = 6;

// The sampler's distribution for top-k 6 at temperature 1: candidates by logit (ties by id).
std::vector<std::pair<int32_t, double>> target_dist(std::span<const float> logits) {
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + kTopK, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<std::pair<int32_t, double>> d;
  double sum = 0;
  for (int i = 0; i < kTopK; ++i) {
    const double p = std::exp(static_cast<double>(logits[idx[i]] - logits[idx[0]]));
    d.push_back({idx[i], p});
    sum += p;
  }
  for (auto& e : d) e.second /= sum;
  return d;
}

// The tiny model's passes, memoised: thousands of generations of three tokens only ever need a
// few hundred distinct passes, so each is run once (a real deferred verify pass) and replayed.
class SpeculativeSampling : public ::testing::Test {
 public:
  void SetUp() override {
    model_ = open_model(test::data_dir() + "/k3-tiny-mxfp4/model");
    vocab_ = model_->config().vocab;
    base_ = model_->new_state();
    model_->forward(base_, std::span<const int32_t>(prompt_.data(), prompt_.size() - 1));
    // The exact joint distribution of the first three tokens.
    for (const auto& [a, pa] : target_dist(next_logits({}))) {
      for (const auto& [b, pb] : target_dist(next_logits({a}))) {
        for (const auto& [c, pc] : target_dist(next_logits({a, b})))
          exact_[{a, b, c}] += pa * pb * pc;
      }
    }
  }

  // Logit rows of the verify pass over `rows` when the state holds the prompt but its last
  // token, then `fed` (what the generation has fed since: the prompt's last token, then the
  // generated tokens consumed).
  const std::vector<float>& pass(const std::vector<int32_t>& fed,
                                 const std::vector<int32_t>& rows) {
    std::vector<int32_t> key = fed;
    key.push_back(-1);
    key.insert(key.end(), rows.begin(), rows.end());
    auto it = passes_.find(key);
    if (it != passes_.end()) return it->second;
    State s = base_;
    if (!fed.empty()) model_->forward(s, fed);
    PendingCommit pc;
    std::vector<float> l = test::verify_pass(*model_, s, rows, pc);
    return passes_.emplace(key, std::move(l)).first->second;
  }
  // The logits after the prompt and `generated`.
  std::span<const float> next_logits(const std::vector<int32_t>& generated) {
    std::vector<int32_t> fed = {prompt_.back()};
    fed.insert(fed.end(), generated.begin(), generated.end());
    const int32_t last = fed.back();
    fed.pop_back();
    return pass(fed, {last});
  }

  GenerationParams params(uint64_t seed) const {
    GenerationParams p;
    p.max_new_tokens = 3;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = kTopK;
    p.sampling.seed = seed;
    p.sampling.has_seed = true;
    return p;
  }

  // One seeded generation of three tokens, verifying up to `k` drafts per pass exactly as
  // drive_step does (accept_rows, then the state holds the rows consumed), from memoised passes.
  std::vector<int32_t> generate(uint64_t seed, Drafter* drafter, int k, DraftStats* stats) {
    Generation g({prompt_.back()}, params(seed), nullptr, vocab_, base_.position());
    std::vector<int32_t> fed;  // what the generation fed to the state
    while (!g.finished()) {
      const std::vector<int32_t> input(g.next_input().begin(), g.next_input().end());
      DraftProposal d;
      if (drafter != nullptr && !g.in_prefill()) {
        std::vector<int32_t> history = {prompt_.back()};  // as drive() gives it
        for (int32_t t : g.completion_ids()) history.push_back(t);
        d = drafter->propose(history, static_cast<int>(std::min<int64_t>(k, g.tokens_left() - 1)));
      }
      std::vector<int32_t> rows = input;
      rows.insert(rows.end(), d.tokens.begin(), d.tokens.end());
      std::vector<float> l = pass(fed, rows);
      const RowsVerdict v = accept_rows(g, l, vocab_, d);
      fed.insert(fed.end(), rows.begin(), rows.begin() + v.fed);
      if (stats != nullptr) {
        stats->proposed += static_cast<int64_t>(d.tokens.size());
        stats->accepted += v.accepted;
      }
    }
    return g.completion_ids();
  }

  // One seeded generation of three tokens through drive() on real passes, the prompt prefilled
  // on an emptied state (one kept, as allocating a state per draw would dominate) so a draft
  // model's tap recorder sees every position.
  std::vector<int32_t> drive_sampled(uint64_t seed, Drafter* drafter, DraftStats* stats) {
    Generation g(prompt_, params(seed), nullptr, vocab_);
    if (!scratch_) scratch_ = std::make_unique<State>(model_->new_state());
    State& s = *scratch_;
    s.reset();
    s.set_taps(nullptr);
    DraftConfig cfg;
    cfg.drafter = drafter;
    cfg.max = 2;
    drive(*model_, s, g, nullptr, nullptr, drafter != nullptr ? &cfg : nullptr);
    if (stats != nullptr) *stats += cfg.stats;
    return g.completion_ids();
  }

  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<State> scratch_;
  int64_t vocab_ = 0;
  std::vector<int32_t> prompt_ = {3, 1, 4, 1, 5, 9, 2, 6};
  State base_;
  std::map<std::vector<int32_t>, double> exact_;
  std::map<std::vector<int32_t>, std::vector<float>> passes_;
};

// Guesses the second most likely token after the history, then the most likely after that:
// deterministic, and often wrong.
class SecondBestDrafter : public Drafter {
 public:
  explicit SecondBestDrafter(SpeculativeSampling* t) : t_(t) {}
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override;

 private:
  SpeculativeSampling* t_;
};

// Draws each draft from q: the target's top two candidates weighted 1:3 (reversed) and one token
// outside its top-k (always rejected), reporting q so rejection sampling decides.
class SyntheticQDrafter : public Drafter {
 public:
  SyntheticQDrafter(SpeculativeSampling* t, uint64_t seed) : t_(t), rng_(seed) {}
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override;

 private:
  SpeculativeSampling* t_;
  std::mt19937_64 rng_;
};

DraftProposal SecondBestDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  DraftProposal p;
  // The history is the generation's prompt (the prompt's last token) and its tokens.
  std::vector<int32_t> gen(history.begin() + 1, history.end());
  for (int i = 0; i < max_tokens; ++i) {
    const auto d = target_dist(t_->next_logits(gen));
    p.tokens.push_back(d[i == 0 ? 1 : 0].first);
    gen.push_back(p.tokens.back());
  }
  return p;
}

DraftProposal SyntheticQDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  DraftProposal p;
  // The history is the generation's prompt (the prompt's last token) and its tokens.
  std::vector<int32_t> gen(history.begin() + 1, history.end());
  for (int i = 0; i < max_tokens; ++i) {
    const auto d = target_dist(t_->next_logits(gen));
    std::vector<float> q(static_cast<size_t>(t_->vocab_), 0.0f);
    q[static_cast<size_t>(d[0].first)] = 0.2f;
    q[static_cast<size_t>(d[1].first)] = 0.6f;
    int32_t outside = 0;
    while (std::any_of(d.begin(), d.end(), [&](const auto& e) { return e.first == outside; }))
      ++outside;
    q[static_cast<size_t>(outside)] = 0.2f;
    std::discrete_distribution<int32_t> draw(q.begin(), q.end());
    p.tokens.push_back(draw(rng_));
    p.q.push_back(std::move(q));
    gen.push_back(p.tokens.back());
  }
  return p;
}

TEST_F(SpeculativeSampling, DeterministicDrafterKeepsSeededTokensAndTheDistribution) {
  SecondBestDrafter drafter(this);
  const int n = 4000;
  std::map<std::vector<int32_t>, int> observed;
  DraftStats st;
  for (int i = 0; i < n; ++i) {
    const auto ids = generate(static_cast<uint64_t>(i), &drafter, 2, &st);
    ASSERT_EQ(ids.size(), 3u);
    // The same seed without drafting: the same tokens (a deterministic drafter keeps the draws).
    if (i < 500) {
      EXPECT_EQ(ids, generate(static_cast<uint64_t>(i), nullptr, 0, nullptr)) << "seed " << i;
    }
    observed[ids]++;
  }
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.accepted, st.proposed);
  const auto [stat, crit] = test::chi_square(exact_, observed, n);
  EXPECT_LT(stat, crit) << "chi-square " << stat << " over the 0.1% critical value " << crit;
}

TEST_F(SpeculativeSampling, RejectionSamplingWithQKeepsTheDistribution) {
  SyntheticQDrafter drafter(this, 99);
  const int n = 4000;
  std::map<std::vector<int32_t>, int> observed, naive;
  DraftStats st;
  for (int i = 0; i < n; ++i) {
    observed[generate(static_cast<uint64_t>(i), &drafter, 2, &st)]++;
  }
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.accepted, st.proposed);
  const auto [stat, crit] = test::chi_square(exact_, observed, n);
  EXPECT_LT(stat, crit) << "chi-square " << stat << " over the 0.1% critical value " << crit;
  // The test has power: keeping every draft (the drafts' own distribution) is rejected.
  for (int i = 0; i < n; ++i) {
    const auto first = generate(static_cast<uint64_t>(i), nullptr, 0, nullptr)[0];
    const std::vector<int32_t> h = {prompt_.back(), first};
    const auto d = drafter.propose(h, 2);
    naive[{first, d.tokens[0], d.tokens[1]}]++;
  }
  EXPECT_GT(test::chi_square(exact_, naive, n).first, crit);
}

// Remembers the first draft of the first proposal (the token after the prompt and the first
// sampled one) of the model drafter it wraps.
class FirstDraft : public Drafter {
 public:
  explicit FirstDraft(Drafter& d) : d_(d) {}
  void attach(State& s) override { d_.attach(s); }
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override {
    DraftProposal p = d_.propose(history, max_tokens);
    if (first < 0 && !p.tokens.empty()) first = p.tokens[0];
    return p;
  }
  int32_t first = -1;

 private:
  Drafter& d_;
};

// The draft models of issue 13: each is a top-1 chain (a deterministic drafter), so seeded
// sampling gives the plain three tokens and the distribution of the first two (the second is
// where the first draft is judged; real passes make thousands of draws slow) is the target's. The
// test has power: a broken acceptance that keeps the model's first draft is rejected.
TEST_F(SpeculativeSampling, DraftModelsKeepTheDistribution) {
  std::map<std::vector<int32_t>, double> exact2;  // the first two tokens
  for (const auto& [k, p] : exact_) exact2[{k[0], k[1]}] += p;
  for (const char* kind : {"eagle3.1", "eagle3", "dspark"}) {
    const std::string dir = test::temp_dir(std::string("spec_sampling_") + kind) + "/draft";
    make_draft_model(dir, synthetic_draft_preset(kind), model_->config());
    const auto dm = open_draft_model(dir, model_->config());
    const int n = 200;  // real passes each (not memoised): enough for the 0.1% test
    std::map<std::vector<int32_t>, int> observed, kept;
    DraftStats st;
    for (int i = 0; i < n; ++i) {
      const auto drafter = dm->new_drafter(*model_);
      FirstDraft first(*drafter);
      const auto ids = drive_sampled(static_cast<uint64_t>(i), &first, &st);
      ASSERT_EQ(ids.size(), 3u);
      ASSERT_TRUE(drafter->fallback_reason().empty()) << drafter->fallback_reason();
      if (i < 50) {
        EXPECT_EQ(ids, drive_sampled(static_cast<uint64_t>(i), nullptr, nullptr))
            << kind << " seed " << i;
      }
      observed[{ids[0], ids[1]}]++;  // the second token is where the first draft is judged
      kept[{ids[0], first.first}]++;
    }
    EXPECT_GE(st.proposed, n) << kind;
    const auto [stat, crit] = test::chi_square(exact2, observed, n);
    EXPECT_LT(stat, crit) << kind << ": chi-square " << stat << " over the 0.1% critical value "
                          << crit;
    const auto [broken, crit2] = test::chi_square(exact2, kept, n);
    EXPECT_GT(broken, crit2) << kind << ": keeping every draft was not rejected";
  }
}

// Through drive() on the real passes: greedy with a q drafter is the argmax, and seeded
// sampling with the deterministic drafter gives the plain tokens.
TEST_F(SpeculativeSampling, DriveWithDraftsKeepsGreedyAndSeededTokens) {
  for (float temperature : {0.0f, 1.0f}) {
    for (uint64_t seed : {1, 2, 3}) {
      GenerationParams p = params(seed);
      p.sampling.temperature = temperature;
      p.max_new_tokens = 8;
      Generation plain({prompt_.back()}, p, nullptr, vocab_, base_.position());
      State ps = base_;
      drive(*model_, ps, plain, nullptr, nullptr);
      SecondBestDrafter second(this);
      SyntheticQDrafter q(this, seed);
      for (Drafter* drafter : {static_cast<Drafter*>(&second), static_cast<Drafter*>(&q)}) {
        if (temperature > 0 && drafter == &q) continue;  // same distribution, other draws
        DraftConfig cfg;
        cfg.drafter = drafter;
        cfg.max = 3;
        Generation spec({prompt_.back()}, p, nullptr, vocab_, base_.position());
        State ss = base_;
        drive(*model_, ss, spec, nullptr, nullptr, &cfg);
        EXPECT_EQ(spec.completion_ids(), plain.completion_ids()) << "T=" << temperature;
        EXPECT_EQ(ss.position(), ps.position());
      }
    }
  }
}

TEST(DraftLength, VerifiesDraftsOnlyWhenTheyPay) {
  // A pass that costs the same for any row count: every likely draft pays.
  PassCostModel flat(1e9, 0, 0, 0, 0);
  DraftProposal d;
  d.tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<std::vector<double>> likely = {expected_tokens(d, 0.9)};
  EXPECT_EQ(choose_draft_lengths(likely, 1, flat)[0], 6);
  // Cost linear in rows (compute bound): a draft must be accepted more often than the row
  // costs relative to a pass, so at rate 0.3 none is verified.
  PassCostModel linear(0, 0, 0, 0, 0);
  for (int r = 1; r <= 8; ++r) linear.observe(r, 0.01 * r);
  const std::vector<std::vector<double>> unlikely = {expected_tokens(d, 0.3)};
  EXPECT_EQ(choose_draft_lengths(unlikely, 1, linear)[0], 0);
  // Half the pass is fixed: with rate 0.9, some drafts but not all six.
  PassCostModel half(0, 0, 0, 0, 0);
  for (int r = 1; r <= 8; ++r) half.observe(r, 1.0 + 0.5 * (r - 1));
  const int k = choose_draft_lengths(likely, 1, half)[0];
  EXPECT_GE(k, 1);
  EXPECT_LT(k, 6);
  // A drafter's own confidence replaces the measured rate.
  d.confidence = {0.99f, 0.99f, 0.01f, 0.01f, 0.01f, 0.01f};
  const std::vector<std::vector<double>> conf = {expected_tokens(d, 0.5)};
  EXPECT_EQ(choose_draft_lengths(conf, 1, half)[0], 2);
}

TEST(DraftLength, SharesAPassAmongSequencesByExpectedGain) {
  PassCostModel half(0, 0, 0, 0, 0);
  for (int r = 1; r <= 24; ++r) half.observe(r, 4.0 + 0.5 * (r - 1));
  DraftProposal d;
  d.tokens = {1, 2, 3, 4};
  const std::vector<std::vector<double>> e = {expected_tokens(d, 0.95), expected_tokens(d, 0.05)};
  const auto k = choose_draft_lengths(e, 2, half);
  EXPECT_GE(k[0], 2);
  EXPECT_EQ(k[1], 0);
}

TEST(DraftLength, PassCostExtrapolatesFromMeasurementsAlongTheBytesPrior) {
  // Trunk 100 bytes, experts 10 bytes, 1 MoE layer of 8 experts, top-2.
  PassCostModel c(100, 10, 1, 8, 2);
  EXPECT_GT(c.bytes(4), c.bytes(1));
  EXPECT_LT(c.bytes(4) - c.bytes(3), c.bytes(2) - c.bytes(1));  // the union grows ever slower
  EXPECT_DOUBLE_EQ(c.predict(1), 1.0);                          // nothing measured: relative bytes
  c.observe(1, 2.0);
  EXPECT_DOUBLE_EQ(c.predict(1), 2.0);
  EXPECT_NEAR(c.predict(3), 2.0 * c.bytes(3) / c.bytes(1), 1e-12);
  c.observe(5, 4.0);
  EXPECT_NEAR(c.predict(3), 3.0, 1e-12);  // between two measurements: linear
  EXPECT_GE(c.predict(7), 4.0);
  AcceptanceEstimate a;
  EXPECT_DOUBLE_EQ(a.rate(), 0.5);
  for (int i = 0; i < 20; ++i) a.observe(4, 4);
  EXPECT_GT(a.rate(), 0.9);
  for (int i = 0; i < 100; ++i) a.observe(4, 0);
  EXPECT_LT(a.rate(), 0.1);
  // Drafts cut to none still teach it: the emitted token shows the first draft was right.
  for (int i = 0; i < 60; ++i)
    a.observe_pass(std::vector<int32_t>{5, 6}, 0, 0, std::vector<int32_t>{5});
  EXPECT_GT(a.rate(), 0.9);
  const double before = a.rate();
  a.observe_pass(std::vector<int32_t>{5, 6}, 1, 0, std::vector<int32_t>{7});  // a plain rejection
  EXPECT_LT(a.rate(), before);
}

}  // namespace
}  // namespace deltafin
