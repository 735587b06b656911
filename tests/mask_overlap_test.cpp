// Mask work overlaps the forward pass (docs/STRUCTURED-OUTPUT.md, "Speed"): the drafting round
// hands the grammar nodes the pass's rows will need, and that are not computed yet, to a helper
// thread while Model::forward runs; warm masks are left to the rows. These tests drive rounds
// on the trained demo model under a JSON Schema compiled fresh (cold) and check that the cold
// work was found and done during the passes, that a warm grammar hands nothing over, and that
// the output is the same either way and with drafts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "generate/driver.h"
#include "generate/generation_config.h"
#include "generate/round.h"
#include "grammar/constraint.h"
#include "replay_drafter.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":12},
  "tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":3},
  "count":{"type":"integer","minimum":0,"maximum":999}},
  "required":["name","tags","count"],"additionalProperties":false})";

struct Demo {
  std::unique_ptr<LoadedModel> model = open_model(test::demo_model_dir());
  Tokenizer tok = Tokenizer::load(test::demo_model_dir());
};

Demo& demo() {
  static Demo d;
  return d;
}

// A fresh compile of the schema, not from the vocabulary's cache: every node is cold.
std::shared_ptr<const grammar::Constraint> fresh_constraint() {
  auto g = grammar::compile_json_schema(nlohmann::ordered_json::parse(kSchema),
                                        grammar::TokenVocab::of(demo().tok), false);
  return std::make_shared<const grammar::Constraint>(grammar::Constraint{g, {}, "json_schema"});
}

GenerationParams params(std::shared_ptr<const grammar::Constraint> c) {
  GenerationParams p;
  p.max_new_tokens = 60;
  p.sampling.temperature = 1.0f;
  p.sampling.seed = 7;
  p.sampling.has_seed = true;
  p.stop_ids = stop_ids_for(demo().model->config(), &demo().tok, {});
  p.constraint = std::move(c);
  return p;
}

struct Outcome {
  std::vector<int32_t> ids;
  int64_t overlapped = 0;       // nodes handed to the helper over all rounds
  int64_t first_sampling = -1;  // ... in the round that sampled the first token
};

Outcome generate(const GenerationParams& p, DraftConfig* draft = nullptr) {
  Model& m = *demo().model;
  const std::vector<int32_t> prompt = demo().tok.encode_ordinary("A record, as JSON:\n");
  Generation g(prompt, p, &demo().tok, m.config().vocab);
  State st = m.new_state();
  RoundSequence seq;
  seq.state = &st;
  seq.gen = &g;
  seq.draft = draft;
  Outcome o;
  while (!g.finished()) {
    const RoundReport r = run_round(m, std::span<RoundSequence>(&seq, 1), 0, nullptr);
    if (seq.error) std::rethrow_exception(seq.error);
    o.overlapped += r.mask_nodes_overlapped;
    if (o.first_sampling < 0 && !g.tokens().empty()) o.first_sampling = r.mask_nodes_overlapped;
  }
  o.ids = g.completion_ids();
  return o;
}

TEST(MaskOverlap, ColdGrammarNodesAreComputedDuringThePassAndOutputIsUnchanged) {
  const auto cold = fresh_constraint();
  const size_t before = cold->grammar->nodes_computed();
  EXPECT_EQ(before, 0u);
  const Outcome a = generate(params(cold));
  // The pass that samples the first token found the root's nodes cold and handed them over.
  EXPECT_GT(a.first_sampling, 0);
  EXPECT_GT(a.overlapped, a.first_sampling);  // later positions reach new nodes too
  EXPECT_GE(cold->grammar->nodes_computed(), static_cast<size_t>(a.overlapped));
  ASSERT_FALSE(a.ids.empty());

  // The same grammar again, now warm along this path: nothing is handed over, same tokens.
  const Outcome b = generate(params(cold));
  EXPECT_EQ(b.overlapped, 0);
  EXPECT_EQ(b.ids, a.ids);

  // A grammar with every node computed first: the same tokens as with overlapped mask work.
  const auto warm = fresh_constraint();
  warm->grammar->precompute();
  const Outcome c = generate(params(warm));
  EXPECT_EQ(c.overlapped, 0);
  EXPECT_EQ(c.ids, a.ids);
}

TEST(MaskOverlap, VerifyPassesPrepareTheDraftedPositionsToo) {
  GenerationParams p = params(fresh_constraint());
  p.sampling.temperature = 0;  // greedy: drafts of the known continuation are all accepted
  const Outcome plain = generate(p);
  ASSERT_GT(plain.ids.size(), 8u);
  std::vector<int32_t> full = demo().tok.encode_ordinary("A record, as JSON:\n");
  full.insert(full.end(), plain.ids.begin(), plain.ids.end());

  p.constraint = fresh_constraint();  // cold again
  test::ReplayDrafter drafter(full, 0, static_cast<int32_t>(demo().model->config().vocab));
  DraftConfig cfg;
  cfg.drafter = &drafter;
  cfg.max = 6;
  const Outcome drafted = generate(p, &cfg);
  EXPECT_EQ(drafted.ids, plain.ids);
  EXPECT_EQ(cfg.stats.accepted, cfg.stats.proposed);
  // Fewer passes than tokens, yet every node the masks needed was cold on the first visit and
  // found before its pass: as many as the plain run handed over one position at a time.
  EXPECT_LT(cfg.stats.target_passes, static_cast<int64_t>(plain.ids.size()));
  EXPECT_EQ(drafted.overlapped, plain.overlapped);
}

}  // namespace
}  // namespace deltafin
