// Choosing the next token from logits. Greedy (temperature 0, the default) takes the argmax.
// Otherwise, in llama.cpp's order: repetition / presence / frequency penalties, top-k, top-p,
// min-p, temperature, then a draw from a seeded generator (std::mt19937_64), so the same seed
// and settings give the same tokens. A grammar's mask (`allowed`), when given, comes after the
// penalties and before top-k: only allowed tokens are candidates, so the distribution is the
// model's restricted to them and renormalised, greedy takes the best allowed token, and top-k,
// top-p and min-p count allowed tokens only. (Penalties and the mask act on single tokens and
// commute; logit_bias is applied to the logits before all of this.) Penalties look at the tokens
// generated so far (repetition also at the last 64 prompt tokens, as llama.cpp's repeat_last_n).
//
// Speculative rejection sampling (verify_draft) shares that one pipeline: p, the distribution a
// plain draw would use, is built by the same code, so a drafted token is judged against exactly
// what plain sampling would have drawn from.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace deltafin {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  float repetition_penalty =
      1.0f;                       // 1 = off (CTRL-style: divide positive logits, multiply negative)
  float presence_penalty = 0.0f;  // OpenAI semantics, subtracted once per seen token
  float frequency_penalty = 0.0f;  // subtracted per occurrence
  uint64_t seed = 0;
  bool has_seed = false;  // without one a random seed is drawn (and reported)

  bool greedy() const { return temperature <= 0.0f; }
  // Throws InvalidArgument naming the field when a value is out of range.
  void validate() const;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

class Sampler {
 public:
  // How many of the last prompt tokens the repetition penalty sees (llama.cpp's repeat_last_n).
  static constexpr size_t kRepeatWindow = 64;
  Sampler(const SamplingParams& p, int64_t vocab);
  // `recent_context` are prompt tokens (for the repetition window), `generated` the tokens
  // sampled so far. `logits` is not modified.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> recent_context,
                 std::span<const int32_t> generated, const grammar::TokenMask* allowed = nullptr);
  uint64_t seed() const { return seed_; }
  const SamplingParams& params() const { return p_; }

  // Speculative sampling of one row with a drafted token `draft` whose draft distribution is
  // `q` ([vocab]): accepts it with probability min(1, p(draft) / q(draft)); otherwise draws from
  // the normalised max(0, p - q). The result is distributed as a plain draw from p. Greedy
  // (temperature 0) accepts exactly when the draft is the argmax and draws nothing. Sets
  // `accepted` and returns the token.
  int32_t verify_draft(std::span<const float> logits, std::span<const int32_t> recent_context,
                       std::span<const int32_t> generated, int32_t draft, std::span<const float> q,
                       bool& accepted, const grammar::TokenMask* allowed = nullptr);

 private:
  // Penalised logits into work_ (greedy: done); then the candidates idx_[0..n) and their
  // unnormalised probabilities after top-k / top-p / min-p and temperature in prob_.
  void penalise(std::span<const float> logits, std::span<const int32_t> recent_context,
                std::span<const int32_t> generated, const grammar::TokenMask* allowed);
  size_t candidates(const grammar::TokenMask* allowed);
  int32_t argmax_work() const;

  SamplingParams p_;
  int64_t vocab_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> idx_;
  std::vector<double> prob_;
};

// log softmax of `logits` at `chosen`, plus the `top` most likely ids (descending) when top > 0.
TokenLogprob logprob_of(std::span<const float> logits, int32_t chosen);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int top);

}  // namespace deltafin
