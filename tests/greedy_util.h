// Test aids for speculative decoding on the library: the greedy verdict of a verify pass read off
// its logits, one deferred verify pass, and greedy generation through drive() (the accept loop
// run and chat use). The product's own paths are generate/round.h and runtime/sequence.h; these
// exist so tests can state what those paths must agree with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "generate/driver.h"
#include "generate/speculative.h"
#include "model/model.h"

namespace deltafin::test {

struct GreedyVerdict {
  int accepted = 0;  // drafts equal to the target's argmax
  int32_t next = 0;  // the target's token after the accepted prefix (correction or bonus)
};

// `logits` are rows [drafts.size() + 1, vocab] of the pass over [last, d1 .. dk].
inline GreedyVerdict verify_greedy(std::span<const float> logits, int64_t vocab,
                                   std::span<const int32_t> drafts) {
  GreedyVerdict v;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const auto row = logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    const auto t = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    if (i == drafts.size() || t != drafts[i]) {
      v.next = t;
      return v;
    }
    ++v.accepted;
  }
  return v;
}

// One deferred target pass over `rows` = [last committed token, d1 .. dk]: logits for every row
// ([rows, vocab]); KDA/conv state stays as it was until Model::commit(state, pending, n).
inline std::vector<float> verify_pass(Model& model, State& state, std::span<const int32_t> rows,
                                      PendingCommit& pending) {
  SequenceInput in;
  in.state = &state;
  in.tokens = rows;
  in.all_logits = true;
  in.pending = &pending;
  return model.forward(std::span<SequenceInput>(&in, 1));
}

// Greedy generation of up to `max_new` tokens after `prompt` (non-empty), stopping after a token
// in `stop_ids`. With a drafter each decode pass verifies up to `draft_max` drafts; without one
// it is plain greedy decoding. The result is identical either way.
inline std::vector<int32_t> generate_greedy(Model& model, State& state,
                                            std::span<const int32_t> prompt, int64_t max_new,
                                            std::span<const int32_t> stop_ids, Drafter* drafter,
                                            int draft_max, DraftStats* stats = nullptr) {
  GenerationParams params;
  params.max_new_tokens = max_new;
  params.stop_ids.assign(stop_ids.begin(), stop_ids.end());
  params.prefill_chunk = std::max<int64_t>(1, static_cast<int64_t>(prompt.size()));
  Generation gen(std::vector<int32_t>(prompt.begin(), prompt.end()), params, nullptr,
                 model.config().vocab);
  DraftConfig cfg;
  cfg.drafter = drafter;
  cfg.max = std::max(1, draft_max);
  drive(model, state, gen, nullptr, nullptr, &cfg);
  if (stats) *stats += cfg.stats;
  return gen.completion_ids();
}

}  // namespace deltafin::test
