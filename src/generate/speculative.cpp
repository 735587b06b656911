// Greedy speculative verification and the prompt-lookup drafter. Kept free of the model's
// internals: it uses only Model::forward with a PendingCommit and Model::commit, so the exact
// engine is untouched and the output cannot differ from plain decoding (see speculative.h).
#include "generate/speculative.h"

#include <algorithm>

#include "core/error.h"
#include "model/model.h"

namespace deltafin {

DraftProposal NgramDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  DraftProposal out;
  const int64_t h = static_cast<int64_t>(history.size());
  if (max_tokens <= 0) return out;
  for (int n = std::min<int64_t>(max_n_, h - 1); n >= min_n_; --n) {
    const auto tail = history.subspan(h - n);
    // Most recent earlier occurrence whose continuation exists.
    for (int64_t start = h - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), history.begin() + start)) continue;
      for (int64_t i = start + n; i < h && static_cast<int>(out.tokens.size()) < max_tokens; ++i)
        out.tokens.push_back(history[i]);
      return out;
    }
  }
  return out;
}

std::unique_ptr<Drafter> make_drafter(const std::string& name) {
  if (name == "none") return nullptr;
  if (name == "ngram") return std::make_unique<NgramDrafter>();
  throw InvalidArgument("unknown drafter '" + name + "' (expected none or ngram)");
}

void validate_draft_max(int64_t n) {
  if (n < 1)
    throw InvalidArgument("--draft-max must be at least 1 (got " + std::to_string(n) + ")");
}

static int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

GreedyVerdict verify_greedy(std::span<const float> logits, int64_t vocab,
                            std::span<const int32_t> drafts) {
  GreedyVerdict v;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const int32_t t = argmax(logits.subspan(i * vocab, vocab));
    if (i == drafts.size() || t != drafts[i]) {
      v.next = t;
      return v;
    }
    ++v.accepted;
  }
  return v;
}

std::vector<float> verify_pass(Model& model, State& state, std::span<const int32_t> rows,
                               PendingCommit& pending) {
  SequenceInput in;
  in.state = &state;
  in.tokens = rows;
  in.all_logits = true;
  in.pending = &pending;
  return model.forward(std::span<SequenceInput>(&in, 1));
}

std::vector<int32_t> generate_greedy(Model& model, State& state, std::span<const int32_t> prompt,
                                     int64_t max_new, std::span<const int32_t> stop_ids,
                                     Drafter* drafter, int draft_max, DraftStats* stats) {
  const int64_t vocab = model.config().vocab;
  std::vector<int32_t> history(prompt.begin(), prompt.end()), out;
  auto is_stop = [&](int32_t t) {
    return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
  };
  if (max_new <= 0) return out;
  if (drafter) drafter->attach(state);
  auto logits = model.forward(state, prompt);
  int32_t next = argmax(logits);
  while (true) {
    out.push_back(next);
    history.push_back(next);
    if (is_stop(next) || static_cast<int64_t>(out.size()) >= max_new) break;
    // The drafts are only worth verifying up to the remaining token budget.
    const int room = static_cast<int>(std::min<int64_t>(draft_max, max_new - out.size() - 1));
    DraftProposal d;
    if (drafter && room > 0) d = drafter->propose(history, room);
    std::vector<int32_t> rows = {next};
    rows.insert(rows.end(), d.tokens.begin(), d.tokens.end());
    PendingCommit pending;
    const std::vector<float> lv = verify_pass(model, state, rows, pending);
    const GreedyVerdict v = verify_greedy(lv, vocab, d.tokens);
    model.commit(state, pending, 1 + v.accepted);
    if (drafter) drafter->on_verified(static_cast<int>(d.tokens.size()), v.accepted);
    if (stats) {
      stats->proposed += static_cast<int64_t>(d.tokens.size());
      stats->accepted += v.accepted;
      ++stats->target_passes;
    }
    // Accepted drafts are emitted one by one so a stop token inside the run ends it exactly
    // where plain decoding would.
    bool stopped = false;
    for (int i = 0; i < v.accepted; ++i) {
      out.push_back(d.tokens[i]);
      history.push_back(d.tokens[i]);
      if (is_stop(d.tokens[i]) || static_cast<int64_t>(out.size()) >= max_new) {
        stopped = true;
        break;
      }
    }
    if (stopped) break;
    next = v.next;
  }
  if (stats) stats->tokens += static_cast<int64_t>(out.size()) - 1;  // after the prefill's
  return out;
}

}  // namespace deltafin
