// Exact constrained sampling: a Generation under a grammar draws from the model's distribution
// restricted to the allowed tokens and renormalised, with the mask before top-k / top-p / min-p
// and temperature. The reference here computes that distribution on its own (the allowed set from
// the token strings, the truncations in double precision) and a chi-square test over many seeded
// draws compares; the same test run with a broken mask (one allowed token dropped, one
// forbidden token let through) must fail, which shows it can.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "fixtures/synthetic_tokenizer.h"
#include "generate/generation.h"
#include "grammar/constraint.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

const Tokenizer& small_tokenizer() {
  static const Tokenizer t = [] {
    const std::string dir = test::temp_dir("constrained-tok");
    write_synthetic_tokenizer(dir, 1024);
    return Tokenizer::load(dir);
  }();
  return t;
}

// The grammar `root ::= [a-h] | "x" [a-z]` allows first: a..h, "x", and "x" + a letter.
bool reference_allowed(std::string_view b) {
  if (b.size() == 1) return (b[0] >= 'a' && b[0] <= 'h') || b[0] == 'x';
  return b.size() == 2 && b[0] == 'x' && b[1] >= 'a' && b[1] <= 'z';
}
const char* kGrammar = "root ::= [a-h] | \"x\" [a-z]\n";

struct Settings {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
};

// The target distribution, computed independently: allowed tokens only, then top-k, top-p and
// min-p on the temperature-1 probabilities (llama.cpp's order), then temperature.
std::map<int32_t, double> reference(const std::vector<float>& logits,
                                    const std::vector<bool>& allowed, const Settings& s) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i)
    if (allowed[static_cast<size_t>(i)]) ids.push_back(i);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (s.top_k > 0 && ids.size() > static_cast<size_t>(s.top_k))
    ids.resize(static_cast<size_t>(s.top_k));
  double z = 0;
  for (int32_t i : ids) z += std::exp(double(logits[i]) - logits[ids[0]]);
  if (s.top_p < 1.0f) {
    double acc = 0;
    size_t keep = ids.size();
    for (size_t k = 0; k < ids.size(); ++k) {
      acc += std::exp(double(logits[ids[k]]) - logits[ids[0]]) / z;
      if (acc >= s.top_p) {
        keep = k + 1;
        break;
      }
    }
    ids.resize(keep);
  }
  if (s.min_p > 0.0f) {
    std::vector<int32_t> kept;
    for (int32_t i : ids)
      if (std::exp(double(logits[i]) - logits[ids[0]]) >= s.min_p) kept.push_back(i);
    ids = kept;
  }
  std::map<int32_t, double> p;
  double t = 0;
  for (int32_t i : ids) t += p[i] = std::exp((double(logits[i]) - logits[ids[0]]) / s.temperature);
  for (auto& [i, v] : p) v /= t;
  return p;
}

// Whether the draws fail a chi-square test against `expected` at the 0.1% level.
bool chi_square_rejects(const std::map<int32_t, int64_t>& counts,
                        const std::map<int32_t, double>& expected, int64_t n, double* stat_out) {
  const auto [stat, crit] = test::chi_square(expected, counts, n);
  *stat_out = stat;
  return stat > crit;
}

std::vector<float> random_logits(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& x : l) x = d(rng);
  return l;
}

std::map<int32_t, int64_t> draw(const std::vector<float>& logits, const Settings& s,
                                const grammar::TokenMask* forced_mask, int64_t n) {
  const Tokenizer& tok = small_tokenizer();
  GenerationParams p;
  p.max_new_tokens = 1;
  p.sampling.temperature = s.temperature;
  p.sampling.top_k = s.top_k;
  p.sampling.top_p = s.top_p;
  p.sampling.min_p = s.min_p;
  p.sampling.has_seed = true;
  p.constraint = std::make_shared<const grammar::Constraint>(grammar::Constraint{
      grammar::compile_gbnf(kGrammar, grammar::TokenVocab::of(tok)), {}, "grammar"});
  std::map<int32_t, int64_t> counts;
  if (forced_mask != nullptr) {
    // The broken variant: the sampler itself, handed a wrong mask.
    SamplingParams sp = p.sampling;
    sp.seed = 1;
    Sampler sampler(sp, tok.vocab_size());
    for (int64_t i = 0; i < n; ++i) ++counts[sampler.sample(logits, {}, {}, forced_mask)];
    return counts;
  }
  for (int64_t i = 0; i < n; ++i) {
    p.sampling.seed = static_cast<uint64_t>(i) * 7919 + 1;
    Generation g({1}, p, &tok, tok.vocab_size());
    g.on_logits(logits);
    ++counts[g.tokens().at(0).id];
  }
  return counts;
}

TEST(ConstrainedSampling, MaskIsTheGrammarsSetAndGreedyTakesTheBestAllowed) {
  const Tokenizer& tok = small_tokenizer();
  const auto g = grammar::compile_gbnf(kGrammar, grammar::TokenVocab::of(tok));
  grammar::Matcher m(g, {});
  grammar::TokenMask mask;
  m.fill_mask(mask);
  int allowed = 0;
  for (int32_t t = 0; t < tok.vocab_size(); ++t) {
    const bool want = !tok.is_special(t) && reference_allowed(tok.token_bytes(t));
    EXPECT_EQ(mask.test(t), want) << "token " << t << " `" << tok.token_bytes(t) << "`";
    allowed += want;
  }
  EXPECT_GE(allowed, 9);  // a..h and x (this vocabulary has no two-letter x tokens)
  auto logits = random_logits(tok.vocab_size(), 3);
  int32_t best = -1;
  for (int32_t t = 0; t < tok.vocab_size(); ++t)
    if (mask.test(t) && (best < 0 || logits[t] > logits[best])) best = t;
  logits[static_cast<size_t>(tok.encode_ordinary("z")[0])] = 100;  // the unconstrained argmax
  GenerationParams p;
  p.max_new_tokens = 1;
  p.constraint = std::make_shared<const grammar::Constraint>(grammar::Constraint{g, {}, "grammar"});
  Generation gen({1}, p, &tok, tok.vocab_size());
  gen.on_logits(logits);
  EXPECT_EQ(gen.tokens().at(0).id, best);
}

TEST(ConstrainedSampling, DrawsFollowTheMaskedRenormalisedDistribution) {
  const Tokenizer& tok = small_tokenizer();
  const auto g = grammar::compile_gbnf(kGrammar, grammar::TokenVocab::of(tok));
  grammar::Matcher m(g, {});
  grammar::TokenMask mask;
  m.fill_mask(mask);
  std::vector<bool> allowed(static_cast<size_t>(tok.vocab_size()));
  for (int32_t t = 0; t < tok.vocab_size(); ++t)
    allowed[static_cast<size_t>(t)] = !tok.is_special(t) && reference_allowed(tok.token_bytes(t));
  // A broken mask: the most likely allowed token dropped, a likely forbidden one let through.
  const auto logits = random_logits(tok.vocab_size(), 11);
  int32_t top_allowed = -1, top_forbidden = -1;
  for (int32_t t = 0; t < tok.vocab_size(); ++t) {
    int32_t& slot = allowed[static_cast<size_t>(t)] ? top_allowed : top_forbidden;
    if (!tok.is_special(t) && (slot < 0 || logits[t] > logits[slot])) slot = t;
  }
  grammar::TokenMask broken = mask;
  broken.clear(top_allowed);
  broken.set(top_forbidden);

  const int64_t n = 6000;
  for (const Settings& s : {Settings{1.0f, 0, 1.0f, 0.0f}, Settings{0.7f, 6, 0.95f, 0.02f}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.temperature << " top_k=" << s.top_k);
    const auto expected = reference(logits, allowed, s);
    double stat = 0;
    EXPECT_FALSE(chi_square_rejects(draw(logits, s, nullptr, n), expected, n, &stat)) << stat;
    // The sampler itself with the true mask passes too; with the broken one it fails.
    EXPECT_FALSE(chi_square_rejects(draw(logits, s, &mask, n), expected, n, &stat)) << stat;
    EXPECT_TRUE(chi_square_rejects(draw(logits, s, &broken, n), expected, n, &stat)) << stat;
  }
}

}  // namespace
}  // namespace deltafin
