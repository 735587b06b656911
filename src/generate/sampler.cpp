#include "generate/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

namespace deltafin {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f)
    fail_arg("temperature {} is out of range (expected 0..100)", temperature);
  if (top_k < 0) fail_arg("top_k {} is out of range (expected >= 0; 0 disables it)", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f))
    fail_arg("top_p {} is out of range (expected 0 < top_p <= 1)", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    fail_arg("min_p {} is out of range (expected 0..1)", min_p);
  if (!(repetition_penalty > 0.0f) || repetition_penalty > 100.0f)
    fail_arg("repetition_penalty {} is out of range (expected > 0)", repetition_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    fail_arg("presence_penalty {} is out of range (expected -2..2)", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    fail_arg("frequency_penalty {} is out of range (expected -2..2)", frequency_penalty);
}

Sampler::Sampler(const SamplingParams& p, int64_t vocab) : p_(p), vocab_(vocab) {
  p_.validate();
  seed_ = p.has_seed
              ? p.seed
              : std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  rng_.seed(seed_);
}

void Sampler::penalise(std::span<const float> logits, std::span<const int32_t> recent_context,
                       std::span<const int32_t> generated, const grammar::TokenMask* allowed) {
  if (static_cast<int64_t>(logits.size()) != vocab_)
    fail("sampler: {} logits for a vocabulary of {}", logits.size(), vocab_);
  work_.assign(logits.begin(), logits.end());
  if (allowed != nullptr) {
    // Tokens the grammar does not allow can never be chosen (greedy included).
    if (allowed->size() != vocab_)
      fail("sampler: a mask of {} tokens for a vocabulary of {}", allowed->size(), vocab_);
    const auto words = allowed->words();
    for (size_t w = 0; w < words.size(); ++w) {
      if (words[w] == ~uint64_t{0}) continue;
      for (size_t b = 0; b < 64 && w * 64 + b < work_.size(); ++b) {
        if (((words[w] >> b) & 1) == 0) work_[w * 64 + b] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  if (p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f)
    return;
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : generated) counts[t]++;
  if (p_.repetition_penalty != 1.0f) {
    const size_t window = kRepeatWindow;
    std::vector<int32_t> seen(generated.begin(), generated.end());
    size_t from = recent_context.size() > window ? recent_context.size() - window : 0;
    seen.insert(seen.end(), recent_context.begin() + static_cast<ptrdiff_t>(from),
                recent_context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      float& l = work_[static_cast<size_t>(t)];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  for (const auto& [t, n] : counts) {
    work_[static_cast<size_t>(t)] -=
        p_.presence_penalty + p_.frequency_penalty * static_cast<float>(n);
  }
}

int32_t Sampler::argmax_work() const {
  return static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
}

size_t Sampler::candidates(const grammar::TokenMask* allowed) {
  // Candidates (the allowed tokens, or all) sorted by logit (descending; ties by id for
  // determinism).
  if (allowed == nullptr) {
    idx_.resize(static_cast<size_t>(vocab_));
    std::iota(idx_.begin(), idx_.end(), 0);
  } else {
    idx_.clear();
    const auto words = allowed->words();
    for (size_t w = 0; w < words.size(); ++w) {
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1)
        idx_.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits))));
    }
    if (idx_.empty()) fail("sampler: the grammar allows no token");
  }
  auto by_logit = [&](int32_t a, int32_t b) {
    return work_[static_cast<size_t>(a)] > work_[static_cast<size_t>(b)] ||
           (work_[static_cast<size_t>(a)] == work_[static_cast<size_t>(b)] && a < b);
  };
  size_t n = idx_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    n = static_cast<size_t>(p_.top_k);
    std::partial_sort(idx_.begin(), idx_.begin() + static_cast<ptrdiff_t>(n), idx_.end(), by_logit);
  } else {
    std::sort(idx_.begin(), idx_.end(), by_logit);
  }
  // Probabilities at temperature 1 for top-p / min-p (as llama.cpp), then temperature.
  const float mx = work_[static_cast<size_t>(idx_[0])];
  std::vector<double>& prob = prob_;
  prob.assign(n, 0.0);
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += (prob[i] = std::exp(static_cast<double>(work_[static_cast<size_t>(idx_[i])] - mx)));
  if (p_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      acc += prob[i] / sum;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double floor = p_.min_p * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
  }
  for (size_t i = 0; i < n; ++i) {
    prob[i] =
        std::exp(static_cast<double>(work_[static_cast<size_t>(idx_[i])] - mx) / p_.temperature);
  }
  prob.resize(n);
  return n;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> recent_context,
                        std::span<const int32_t> generated, const grammar::TokenMask* allowed) {
  penalise(logits, recent_context, generated, allowed);
  if (p_.greedy()) return argmax_work();
  const size_t n = candidates(allowed);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob_[i];
    if (r < acc) return idx_[i];
  }
  return idx_[n - 1];
}

int32_t Sampler::verify_draft(std::span<const float> logits,
                              std::span<const int32_t> recent_context,
                              std::span<const int32_t> generated, int32_t draft,
                              std::span<const float> q, bool& accepted,
                              const grammar::TokenMask* allowed) {
  if (static_cast<int64_t>(q.size()) != vocab_)
    fail("sampler: a draft distribution of {} entries for a vocabulary of {}", q.size(), vocab_);
  penalise(logits, recent_context, generated, allowed);
  if (p_.greedy()) {
    // p is one-hot at the argmax: min(1, p/q) is 1 there and 0 elsewhere, and the residual
    // max(0, p - q) is the argmax again.
    const int32_t t = argmax_work();
    accepted = t == draft;
    return t;
  }
  const size_t n = candidates(allowed);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  double p_draft = 0;
  for (size_t i = 0; i < n; ++i) {
    if (idx_[i] == draft) p_draft = prob_[i] / total;
  }
  const double q_draft =
      draft >= 0 && draft < vocab_ ? static_cast<double>(q[static_cast<size_t>(draft)]) : 0.0;
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  // Accept with probability min(1, p/q): u < p/q, written without the division (q may be 0).
  if (p_draft > 0 && u01(rng_) * q_draft < p_draft) {
    accepted = true;
    return draft;
  }
  accepted = false;
  // The residual max(0, p - q) lives on p's support (outside it p is 0).
  double rest = 0;
  for (size_t i = 0; i < n; ++i) {
    prob_[i] =
        std::max(0.0, prob_[i] / total - static_cast<double>(q[static_cast<size_t>(idx_[i])]));
    rest += prob_[i];
  }
  if (!(rest > 0)) {
    // p <= q everywhere means p == q: a rejection has probability 0 in exact arithmetic; draw
    // from p itself rather than from an empty residual.
    for (size_t i = 0; i < n; ++i) {
      prob_[i] = std::exp(static_cast<double>(work_[static_cast<size_t>(idx_[i])] -
                                              work_[static_cast<size_t>(idx_[0])]) /
                          p_.temperature);
      rest += prob_[i];
    }
  }
  std::uniform_real_distribution<double> u(0.0, rest);
  double r = u(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob_[i];
    if (r < acc) return idx_[i];
  }
  for (size_t i = n; i-- > 0;) {
    if (prob_[i] > 0) return idx_[i];
  }
  return idx_[0];
}

namespace {
double log_sum_exp(std::span<const float> logits, float& mx) {
  mx = *std::max_element(logits.begin(), logits.end());
  double s = 0;
  for (float l : logits) s += std::exp(static_cast<double>(l - mx));
  return std::log(s);
}
}  // namespace

TokenLogprob logprob_of(std::span<const float> logits, int32_t chosen) {
  float mx;
  double lse = log_sum_exp(logits, mx);
  return {chosen, static_cast<float>(logits[static_cast<size_t>(chosen)] - mx - lse)};
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int top) {
  std::vector<TokenLogprob> out;
  if (top <= 0) return out;
  float mx;
  double lse = log_sum_exp(logits, mx);
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  size_t k = std::min<size_t>(static_cast<size_t>(top), idx.size());
  std::partial_sort(
      idx.begin(), idx.begin() + static_cast<ptrdiff_t>(k), idx.end(), [&](int32_t a, int32_t b) {
        return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
               (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
      });
  for (size_t i = 0; i < k; ++i)
    out.push_back({idx[i], static_cast<float>(logits[static_cast<size_t>(idx[i])] - mx - lse)});
  return out;
}

}  // namespace deltafin
