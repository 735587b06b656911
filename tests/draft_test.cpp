// The draft models of issue 13 against the golden cases (tests/data/eagle3-tiny, dspark-tiny,
// float64 references of docs/DRAFT-MODELS.md): the target's taps (both streams) from prefill and
// from deferred verify passes, the EAGLE-3.1 proposals (ids identical, logits within 2e-3) with
// the draft cache built at once or committed step by step, `deltafin propose` through the real
// binary, bad drafter folders refused with one line, and greedy output unchanged with a drafter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "draft/draft_model.h"
#include "draft/eagle3.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "fixtures/synthetic_draft.h"
#include "generate/driver.h"
#include "generate/generation.h"
#include "generate/speculative.h"
#include "greedy_util.h"
#include "model/model.h"
#include "model/taps.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

std::string target_dir() {
  return test::data_dir() + "/k3-tiny-mxfp4/model";
}
std::string eagle_dir() {
  return test::data_dir() + "/eagle3-tiny";
}
std::string dspark_dir() {
  return test::data_dir() + "/dspark-tiny";
}
json read_case(const std::string& dir) {
  return json::parse(test::slurp(dir + "/case.json"));
}
std::vector<float> read_f32(const std::string& path) {
  const std::string raw = test::slurp(path);
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}
float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
std::vector<int32_t> ids(const json& j) {
  return j.get<std::vector<int32_t>>();
}
std::string join_ids(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t t : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(t);
  }
  return s;
}

// Prefills `prefix` with a recorder for `spec` and returns its rows [L][taps][hidden].
std::vector<float> capture(Model& m, const TapSpec& spec, const std::vector<int32_t>& prefix) {
  auto rec = std::make_shared<TapRecorder>(spec, m.config().hidden);
  State s = m.new_state();
  s.set_taps(rec);
  m.forward(s, prefix);
  EXPECT_EQ(rec->begin(), 0);
  EXPECT_EQ(rec->end(), static_cast<int64_t>(prefix.size()));
  return std::vector<float>(rec->row(0), rec->row(0) + rec->end() * rec->width());
}

TEST(Taps, PrefixAndMixtureStreamsMatchTheGoldenCaptures) {
  auto model = open_model(target_dir());
  const json e = read_case(eagle_dir());
  for (const json& p : e["proposals"]) {
    const auto got = capture(*model, {{1, 4, 7}, TapStream::kPartial}, ids(p["prefix"]));
    EXPECT_LT(max_abs_diff(got, read_f32(eagle_dir() + "/" + p["taps_file"].get<std::string>())),
              2e-3f);
  }
  const json d = read_case(dspark_dir());
  for (const json& p : d["proposals"]) {
    const json& other = p["other_convention"];
    ASSERT_EQ(other["feature_convention"], "attn_res");
    const auto mix = capture(*model, {{1, 4, 7}, TapStream::kMixture}, ids(p["prefix"]));
    EXPECT_LT(
        max_abs_diff(mix, read_f32(dspark_dir() + "/" + other["features_file"].get<std::string>())),
        2e-3f);
    const auto raw = capture(*model, {{1, 4, 7}, TapStream::kPartial}, ids(p["prefix"]));
    EXPECT_LT(
        max_abs_diff(raw, read_f32(dspark_dir() + "/" + p["features_file"].get<std::string>())),
        2e-3f);
  }
}

TEST(Taps, OnlyTheAcceptedRowsOfAVerifyPassAreCommitted) {
  auto model = open_model(target_dir());
  const std::vector<int32_t> all = {33, 403, 326, 283, 407, 127, 443, 173, 495, 165};
  const TapSpec spec{{0, 4, 8}, TapStream::kPartial};
  const auto ref = capture(*model, spec, all);
  auto rec = std::make_shared<TapRecorder>(spec, model->config().hidden);
  State s = model->new_state();
  s.set_taps(rec);
  model->forward(s, std::span<const int32_t>(all).subspan(0, 6));
  // A verify pass over 4 rows of which 2 are accepted, then the rest as plain passes.
  PendingCommit pending;
  test::verify_pass(*model, s, std::span<const int32_t>(all).subspan(6, 4), pending);
  EXPECT_EQ(rec->end(), 6) << "a deferred pass's taps wait for the commit";
  model->commit(s, pending, 2);
  EXPECT_EQ(rec->end(), 8);
  model->forward(s, std::span<const int32_t>(all).subspan(8, 2));
  ASSERT_EQ(rec->end(), 10);
  const std::vector<float> got(rec->row(0), rec->row(0) + 10 * rec->width());
  EXPECT_LT(max_abs_diff(got, ref), 1e-4f);
  rec->consume_until(7);
  EXPECT_EQ(rec->begin(), 7);
  s.reset();
  EXPECT_EQ(rec->end(), 0);
}

TEST(Taps, ALayerBeyondTheModelIsRefused) {
  auto c = load_config(target_dir());
  EXPECT_THROW(validate_taps({{1, 9}, TapStream::kPartial}, c, "x"), Error);
  EXPECT_THROW(validate_taps({{8}, TapStream::kMixture}, c, "x"), Error);
  validate_taps({{8}, TapStream::kPartial}, c, "x");
}

// Verifies `d` after `history` (ending with the anchor) greedily and commits the accepted rows.
test::GreedyVerdict verify_and_commit(Model& m, State& s, const std::vector<int32_t>& history,
                                      const DraftProposal& d) {
  std::vector<int32_t> rows = {history.back()};
  rows.insert(rows.end(), d.tokens.begin(), d.tokens.end());
  PendingCommit pending;
  const auto lv = test::verify_pass(m, s, rows, pending);
  const test::GreedyVerdict v = test::verify_greedy(lv, m.config().vocab, d.tokens);
  m.commit(s, pending, 1 + v.accepted);
  return v;
}

// Pair 0 proposed, verified greedily and committed, then the rest of pair 1's prefix committed
// and pair 1 proposed — all on one sequence, so the draft cache is extended, not rebuilt.
struct TwoPairs {
  DraftProposal d0, d1;
  std::vector<float> logits1;
};
TwoPairs propose_both_pairs(Model& m, DraftModel& dm, const json& c, int k) {
  const json p0 = c["proposals"][0], p1 = c["proposals"][1];
  auto d = dm.new_drafter(m);
  State s = m.new_state();
  d->attach(s);
  auto history = ids(p0["prefix"]);
  m.forward(s, history);
  history.push_back(p0["anchor"].get<int32_t>());
  TwoPairs r;
  r.d0 = d->propose(history, k);
  const test::GreedyVerdict v = verify_and_commit(m, s, history, r.d0);
  EXPECT_EQ(v.accepted, p0["verify"]["accepted"].get<int>());
  EXPECT_EQ(v.next, p0["verify"]["next_token"].get<int32_t>());
  const auto prefix1 = ids(p1["prefix"]);
  m.forward(s, std::span<const int32_t>(prefix1).subspan(history.size() + v.accepted));
  auto h1 = prefix1;
  h1.push_back(p1["anchor"].get<int32_t>());
  r.d1 = d->propose(h1, k);
  r.logits1 = d->last_logits();
  EXPECT_EQ(d->fallback_reason(), "");
  return r;
}

// Proposes pair `p` of the EAGLE case from a fresh sequence.
DraftProposal eagle_propose(Model& m, DraftModel& dm, const json& p, std::vector<float>* logits) {
  auto d = dm.new_drafter(m);
  State s = m.new_state();
  d->attach(s);
  const auto prefix = ids(p["prefix"]);
  m.forward(s, prefix);
  auto history = prefix;
  history.push_back(p["anchor"].get<int32_t>());
  auto out = d->propose(history, p["k"].get<int>());
  EXPECT_EQ(d->fallback_reason(), "");
  if (logits) *logits = d->last_logits();
  return out;
}

TEST(Eagle3, ProposalsMatchTheGoldenCase) {
  auto model = open_model(target_dir());
  auto dm = open_draft_model(eagle_dir() + "/model", model->config());
  EXPECT_EQ(dm->config().kind, DraftKind::kEagle3);
  EXPECT_TRUE(dm->config().fc_norm);
  EXPECT_TRUE(dm->config().norm_output);
  const json c = read_case(eagle_dir());
  for (const json& p : c["proposals"]) {
    std::vector<float> logits;
    const DraftProposal d = eagle_propose(*model, *dm, p, &logits);
    EXPECT_EQ(d.tokens, ids(p["draft_ids"]));
    EXPECT_LT(max_abs_diff(logits,
                           read_f32(eagle_dir() + "/" + p["draft_logits_file"].get<std::string>())),
              2e-3f);
    // A top-1 chain is a deterministic drafter: no q (speculative_sampling_test shows why).
    EXPECT_TRUE(d.q.empty());
  }
}

TEST(Eagle3, FusedFeaturesMatchTheGoldenCase) {
  auto model = open_model(target_dir());
  auto dm = std::static_pointer_cast<Eagle3Model>(
      open_draft_model(eagle_dir() + "/model", model->config()));
  const json p = read_case(eagle_dir())["proposals"][0];
  Eagle3Drafter d(*model, dm);
  const auto taps = read_f32(eagle_dir() + "/taps_0.f32");
  const auto want = read_f32(eagle_dir() + "/fused_0.f32");
  const int64_t H = 256;
  std::vector<float> g(H);
  for (int64_t pos = 0; pos < 12; ++pos) {
    d.fuse(taps.data() + pos * 3 * H, g.data());
    EXPECT_LT(max_abs_diff(g, std::span<const float>(want).subspan(pos * H, H)), 2e-3f) << pos;
  }
}

// Pair 1 after pair 0 on the same sequence: pair 0's proposal is verified (its chain rows
// dropped), the accepted rows and the rest of pair 1's prefix are committed from the target's
// real taps, and the proposal equals the one built from scratch.
TEST(Eagle3, CommittingStepByStepEqualsBuildingAtOnce) {
  auto model = open_model(target_dir());
  auto dm = open_draft_model(eagle_dir() + "/model", model->config());
  const json c = read_case(eagle_dir());
  const TwoPairs r = propose_both_pairs(*model, *dm, c, 5);
  EXPECT_EQ(r.d1.tokens, ids(c["proposals"][1]["draft_ids"]));
  EXPECT_LT(max_abs_diff(r.logits1, read_f32(eagle_dir() + "/draft_logits_1.f32")), 2e-3f);
}

TEST(Eagle3, GreedyOutputIsIdenticalWithTheDrafter) {
  auto model = open_model(target_dir());
  auto dm = open_draft_model(eagle_dir() + "/model", model->config());
  const std::vector<int32_t> prompt = {33, 403, 326, 283, 407, 127};
  State s0 = model->new_state();
  const auto plain = test::generate_greedy(*model, s0, prompt, 16, {}, nullptr, 0);
  for (int k : {2, 7}) {
    auto d = dm->new_drafter(*model);
    State s = model->new_state();
    DraftStats st;
    EXPECT_EQ(test::generate_greedy(*model, s, prompt, 16, {}, d.get(), k, &st), plain) << k;
    EXPECT_GT(st.proposed, 0);
    EXPECT_EQ(d->fallback_reason(), "");
  }
}

// `deltafin propose` through the binary reproduces both pairs.
TEST(Propose, Eagle3GoldenCaseThroughTheBinary) {
  const json c = read_case(eagle_dir());
  const std::string tmp = test::temp_dir("propose-eagle");
  for (const json& p : c["proposals"]) {
    const std::string out = tmp + "/logits.f32";
    const std::string tokens = join_ids(ids(p["prefix"]));
    auto r =
        test::run_deltafin({"propose", "--model", target_dir(), "--draft", eagle_dir() + "/model",
                            "--tokens", tokens, "--anchor", std::to_string(p["anchor"].get<int>()),
                            "--drafts", "5", "--logits-out", out, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(ids(j["draft_ids"]), ids(p["draft_ids"]));
    EXPECT_FALSE(j.contains("confidence"));
    EXPECT_LT(max_abs_diff(read_f32(out),
                           read_f32(eagle_dir() + "/" + p["draft_logits_file"].get<std::string>())),
              2e-3f);
  }
}

// The DSpark draft folder with its stream switched to the AttnRes mixture (the lightseek
// convention); the golden case's other_convention holds what that capture gives.
std::string dspark_attn_res_copy() {
  const std::string dir = test::temp_dir("dspark-attn-res");
  json cfg = json::parse(test::slurp(dspark_dir() + "/model/config.json"));
  cfg["aux_hidden_stream"] = "attn_res";
  test::spit(dir + "/config.json", cfg.dump(2));
  test::spit(dir + "/model.safetensors", test::slurp(dspark_dir() + "/model/model.safetensors"));
  return dir;
}

// `deltafin propose` reproduces both pairs with both tap conventions: Markov-corrected ids,
// logits before the Markov bias, and the confidence head's sigmoid.
TEST(Propose, DSparkGoldenCaseThroughTheBinary) {
  const json c = read_case(dspark_dir());
  const std::string tmp = test::temp_dir("propose-dspark");
  const std::string attn_res = dspark_attn_res_copy();
  for (const json& p : c["proposals"]) {
    for (const json* want : {&p, &p["other_convention"]}) {
      const bool mix = want != &p;
      const std::string out = tmp + "/logits.f32";
      auto r = test::run_deltafin(
          {"propose", "--model", target_dir(), "--draft", mix ? attn_res : dspark_dir() + "/model",
           "--tokens", join_ids(ids(p["prefix"])), "--anchor",
           std::to_string(p["anchor"].get<int>()), "--drafts", "7", "--logits-out", out, "--json"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const json j = json::parse(r.out);
      EXPECT_EQ(ids(j["draft_ids"]), ids((*want)["draft_ids"])) << mix;
      const auto conf = j["confidence"].get<std::vector<float>>();
      const auto conf_want = (*want)["confidence"].get<std::vector<float>>();
      EXPECT_LT(max_abs_diff(conf, conf_want), 2e-3f) << mix;
      const auto logits = read_f32(out);
      const auto logits_want =
          read_f32(dspark_dir() + "/" + (*want)["draft_logits_file"].get<std::string>());
      EXPECT_LT(max_abs_diff(logits, logits_want), 2e-3f) << mix;
      std::vector<int32_t> before;  // argmax before the Markov bias
      for (size_t i = 0; i < logits.size() / 512; ++i) {
        before.push_back(static_cast<int32_t>(
            std::max_element(logits.begin() + i * 512, logits.begin() + (i + 1) * 512) -
            logits.begin() - i * 512));
      }
      EXPECT_EQ(before, ids((*want)["argmax_before_markov"])) << mix;
    }
  }
}

// Pair 1's context appended to pair 0's (after a verify pass that accepted some drafts) gives the
// same proposal as building it at once; greedy output is unchanged with the drafter.
TEST(DSpark, AppendingContextEqualsBuildingAtOnceAndGreedyIsUnchanged) {
  auto model = open_model(target_dir());
  auto dm = open_draft_model(dspark_dir() + "/model", model->config());
  EXPECT_EQ(dm->config().kind, DraftKind::kDSpark);
  EXPECT_EQ(dm->config().taps.stream, TapStream::kPartial);
  const json c = read_case(dspark_dir());
  const TwoPairs r = propose_both_pairs(*model, *dm, c, 7);
  EXPECT_EQ(r.d0.tokens, ids(c["proposals"][0]["draft_ids"]));
  EXPECT_EQ(r.d0.confidence.size(), 7u);
  EXPECT_EQ(r.d1.tokens, ids(c["proposals"][1]["draft_ids"]));
  EXPECT_LT(max_abs_diff(r.logits1, read_f32(dspark_dir() + "/draft_logits_prefix_1.f32")), 2e-3f);

  const auto prompt = ids(c["greedy_prompt"]);
  State s0 = model->new_state();
  const auto plain = test::generate_greedy(*model, s0, prompt, 12, {}, nullptr, 0);
  EXPECT_EQ(plain, ids(c["greedy_continuation"]));
  for (int k : {2, 7}) {
    auto dr = dm->new_drafter(*model);
    State s2 = model->new_state();
    EXPECT_EQ(test::generate_greedy(*model, s2, prompt, 12, {}, dr.get(), k), plain) << k;
    EXPECT_EQ(dr->fallback_reason(), "");
  }
}

// A copy of the EAGLE draft folder with `edit` applied to its config and/or weights file.
std::string broken_copy(const std::string& name, const std::function<void(json&)>& edit_config,
                        const std::function<void(std::string&)>& edit_weights = {}) {
  const std::string dir = test::temp_dir("bad-draft-" + name);
  json cfg = json::parse(test::slurp(eagle_dir() + "/model/config.json"));
  if (edit_config) edit_config(cfg);
  test::spit(dir + "/config.json", cfg.dump(2));
  std::string w = test::slurp(eagle_dir() + "/model/model.safetensors");
  if (edit_weights) edit_weights(w);
  test::spit(dir + "/model.safetensors", w);
  return dir;
}

// Rewrites the safetensors header of `w` through `edit` (data offsets are kept).
void edit_header(std::string& w, const std::function<void(json&)>& edit) {
  uint64_t n = 0;
  std::memcpy(&n, w.data(), 8);
  json h = json::parse(w.substr(8, n));
  edit(h);
  std::string text = h.dump();
  text.resize(n, ' ');  // same length: the data region does not move
  ASSERT_EQ(text.size(), n);
  w.replace(8, n, text);
}

TEST(Propose, BadDrafterFoldersGetOneClearLine) {
  struct Case {
    std::string name, dir, expect;
  };
  std::vector<Case> cases = {
      {"hidden", broken_copy("hidden", [](json& c) { c["hidden_size"] = 128; }),
       "hidden_size 128 does not match the target's 256"},
      {"vocab",
       broken_copy("vocab",
                   [](json& c) {
                     c["vocab_size"] = 1000;
                     c["draft_vocab_size"] = 1000;
                   }),
       "vocab_size 1000 does not match the target's vocabulary of 512"},
      {"tap",
       broken_copy("tap",
                   [](json& c) {
                     c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 4, 12};
                   }),
       "tap layer 12 is beyond the target model (9 layers"},
      {"kind",
       broken_copy("kind",
                   [](json& c) {
                     c.erase("eagle_config");
                     c["architectures"] = {"MedusaForCausalLM"};
                     c["model_type"] = "medusa";
                   }),
       "unknown drafter kind (architectures \"MedusaForCausalLM\""},
      {"missing",
       broken_copy("missing", {},
                   [](std::string& w) {
                     edit_header(w, [](json& h) { h.erase("layers.0.hidden_norm.weight"); });
                   }),
       "tensor layers.0.hidden_norm.weight is missing"},
      {"shape",
       broken_copy("shape", {},
                   [](std::string& w) {
                     edit_header(w, [](json& h) { h["lm_head.weight"]["shape"] = {256, 512}; });
                   }),
       "tensor lm_head.weight has shape [256, 512], expected [512, 256]"},
      {"truncated", broken_copy("truncated", {}, [](std::string& w) { w.resize(w.size() / 2); }),
       "model.safetensors"},
      {"fc_norm", broken_copy("fc_norm", [](json& c) { c["fc_norm"] = false; }),
       "holds fc_norm.* tensors but its config.json says fc_norm false"},
  };
  for (const Case& c : cases) {
    auto r = test::run_deltafin({"propose", "--model", target_dir(), "--draft", c.dir, "--tokens",
                                 "1,2,3", "--anchor", "4", "--json"});
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.name << ": " << r.err;
  }
  auto r =
      test::run_deltafin({"propose", "--model", target_dir(), "--draft",
                          test::temp_dir("nodraft") + "/none", "--tokens", "1", "--anchor", "4"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = test::run_deltafin({"propose", "--model", target_dir(), "--draft", eagle_dir() + "/model",
                          "--tokens", "1", "--anchor", "512"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--anchor 512: expected a token id in 0..511"), std::string::npos) << r.err;
}

// `make-model --preset k3` (shrunk so the test takes seconds) with synthetic drafters of every
// kind: greedy output through test::generate_greedy and through drive() (what run and chat use),
// and seeded sampling through drive(), equal the plain runs; the expert store runs at its
// minimum budget with the draft counted in the plan.
TEST(Drafters, SyntheticDraftsKeepOutputOnAK3PresetTarget) {
  const SyntheticSpec s = test::small_k3_spec();
  const std::string root = test::temp_dir("draft-k3");
  const std::string dir = root + "/model";
  make_model(dir, s);
  const ModelConfig c = load_config(dir);
  auto model = open_model(dir);
  const std::vector<int32_t> prompt = {11, 4, 9, 4, 9, 4};
  State s0 = model->new_state();
  const auto plain = test::generate_greedy(*model, s0, prompt, 16, {}, nullptr, 0);
  // Plain runs through drive() (what run and chat use): greedy and seeded sampling.
  auto params_for = [](float temperature) {
    GenerationParams params;
    params.max_new_tokens = 10;
    params.sampling.temperature = temperature;
    params.sampling.seed = 99;
    params.sampling.has_seed = true;
    return params;
  };
  std::vector<std::vector<int32_t>> refs;
  for (float temperature : {0.0f, 0.8f}) {
    Generation ref(prompt, params_for(temperature), nullptr, static_cast<int32_t>(c.vocab));
    State rs = model->new_state();
    drive(*model, rs, ref, nullptr, nullptr);
    refs.push_back(ref.completion_ids());
  }
  for (const char* kind : {"eagle3.1", "eagle3", "dspark", "dspark-attn_res"}) {
    const bool dspark = std::string(kind).rfind("dspark", 0) == 0;
    SyntheticDraftSpec ds = synthetic_draft_preset(dspark ? "dspark" : kind);
    if (std::string(kind) == "dspark-attn_res") ds.stream = TapStream::kMixture;
    const std::string ddir = root + "/" + kind;
    make_draft_model(ddir, ds, c);
    auto dm = open_draft_model(ddir, c);
    EXPECT_GT(dm->weight_bytes(), 0u);
    auto d = dm->new_drafter(*model);
    State st = model->new_state();
    DraftStats stats;
    EXPECT_EQ(test::generate_greedy(*model, st, prompt, 16, {}, d.get(), 3, &stats), plain) << kind;
    EXPECT_GT(stats.proposed, 0) << kind;
    EXPECT_EQ(d->fallback_reason(), "") << kind;
    // Greedy: the tokens of plain decoding. Seeded sampling: these drafters give q rows, so
    // acceptance is rejection sampling (min(1, p/q), then max(0, p - q)), which keeps the
    // distribution (tests/speculative_sampling_test.cpp) but not the plain run's exact draws;
    // the same seed must still give the same tokens every time.
    std::vector<int32_t> sampled;
    for (int i : {0, 1, 1}) {
      auto dd = dm->new_drafter(*model);
      DraftConfig cfg;
      cfg.drafter = dd.get();
      cfg.max = 3;
      Generation spec(prompt, params_for(i == 0 ? 0.0f : 0.8f), nullptr,
                      static_cast<int32_t>(c.vocab));
      State ss = model->new_state();
      drive(*model, ss, spec, nullptr, nullptr, &cfg);
      EXPECT_GT(cfg.stats.proposed, 0) << kind;
      if (i == 0) {
        EXPECT_EQ(spec.completion_ids(), refs[0]) << kind << " greedy";
      } else if (sampled.empty()) {
        sampled = spec.completion_ids();
        EXPECT_EQ(sampled.size(), refs[1].size()) << kind;
      } else {
        EXPECT_EQ(spec.completion_ids(), sampled) << kind << ": the same seed, other tokens";
      }
    }
  }
  // Under the smallest budget the plan allows with the draft counted, output is unchanged.
  auto dm = open_draft_model(root + "/eagle3.1", c);
  auto ck = Checkpoint::open(dir);
  PlanOptions po;
  po.budget = 1ull << 40;
  po.shape.max_rows = 16;
  po.shape.draft_weight_bytes = dm->weight_bytes();
  po.shape.draft_cache_bytes_per_position = dm->cache_bytes_per_position();
  const MemoryPlan big = plan_memory(c, *ck, po);
  EXPECT_EQ(big.draft_weight_bytes, dm->weight_bytes());
  EXPECT_NE(big.describe().find("draft model"), std::string::npos);
  EngineOptions eo = test::engine_options(dir);
  eo.memory_budget = big.min_working_set;
  auto budgeted = open_model(eo, po.shape);
  auto d = dm->new_drafter(*budgeted);
  State bs = budgeted->new_state();
  EXPECT_EQ(test::generate_greedy(*budgeted, bs, prompt, 16, {}, d.get(), 4), plain);
}

// make-model writes a draft folder that propose loads; -v prints the draft and the plan with it.
TEST(Propose, MakeModelDrafterFoldersThroughTheBinary) {
  const std::string root = test::temp_dir("make-draft");
  for (const char* kind : {"eagle3.1", "dspark"}) {
    const std::string out = root + "/" + kind;
    auto r = test::run_deltafin({"make-model", out, "--drafter", kind, "--target", target_dir(),
                                 "--draft-taps", "2,5", "--quiet"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_deltafin({"propose", "--model", target_dir(), "--draft", out, "--tokens",
                            "5,6,7,8", "--anchor", "9", "--drafts", "3", "--json", "-v"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["draft_ids"].size(), 3u);
    EXPECT_EQ(j.contains("confidence"), std::string(kind) == "dspark");
    EXPECT_NE(r.err.find("taps 2,5 (prefix)"), std::string::npos) << r.err;
  }
  auto r = test::run_deltafin(
      {"make-model", root + "/x", "--drafter", "medusa", "--target", target_dir()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--drafter medusa: expected eagle3.1, eagle3 or dspark"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace deltafin
