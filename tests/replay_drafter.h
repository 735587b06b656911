// A drafter for tests that proposes a known continuation: what follows the history in `full`,
// with the token at every `wrong_every`-th draft position replaced (0: never wrong; 1: always
// wrong), so a test reaches the fully accepted, partly accepted and all rejected cases on a
// model whose output it computed first.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "generate/speculative.h"

namespace deltafin::test {

class ReplayDrafter : public Drafter {
 public:
  ReplayDrafter(std::vector<int32_t> full, int wrong_every, int32_t vocab)
      : full_(std::move(full)), wrong_every_(wrong_every), vocab_(vocab) {}
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override {
    DraftProposal p;
    for (size_t i = history.size(); i < full_.size() && (int)p.tokens.size() < max_tokens; ++i) {
      int32_t t = full_[i];
      ++count_;
      if (wrong_every_ > 0 && count_ % wrong_every_ == 0) t = (t + 1) % vocab_;
      p.tokens.push_back(t);
    }
    return p;
  }

 private:
  std::vector<int32_t> full_;
  int wrong_every_;
  int32_t vocab_;
  int64_t count_ = 0;
};

}  // namespace deltafin::test
