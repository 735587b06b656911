// Speculative decoding that never changes K3's output. A Drafter proposes up to k tokens from a
// sequence's committed history (optionally with its draft distributions q, for the draft
// models of the next issue); one deferred pass (SequenceInput::pending) verifies
// [last committed token, d1 .. dk]; Model::commit advances the KDA/conv state by the accepted
// rows only and truncates the MLA cache. Greedy verification accepts the longest prefix that
// equals the target's argmax and then emits the target's own token, so the completion is the
// one plain greedy decoding gives, token for token. Verification lives here, in src/generate,
// so src/model only supplies the deferred pass and the commit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deltafin {

class Model;
class State;
struct PendingCommit;

struct DraftProposal {
  std::vector<int32_t> tokens;
  // Draft distributions, one [vocab] row per token, or empty for a deterministic drafter
  // (q is then one-hot at the token).
  std::vector<std::vector<float>> q;
  // Per token, the drafter's estimate that it survives given the earlier ones survived (DSpark's
  // confidence head); empty when the drafter has none.
  std::vector<float> confidence;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Called with the sequence's state before its first pass (and again before each later run on
  // the same state). A drafter that reads the target's hidden vectors attaches its tap recorder
  // (model/taps.h) here, so prefill and verify passes record them; others ignore it.
  virtual void attach(State& /*state*/) {}
  // Up to `max_tokens` tokens that may follow `history` (the sequence's committed tokens).
  virtual DraftProposal propose(std::span<const int32_t> history, int max_tokens) = 0;
  // Told after each verify pass how many of the proposed tokens were accepted.
  virtual void on_verified(int /*proposed*/, int /*accepted*/) {}
};

// Prompt lookup: the longest n-gram (n from max_n down to min_n) ending the history that also
// occurs earlier in it; proposes what followed its most recent earlier occurrence.
class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(int min_n = 1, int max_n = 4) : min_n_(min_n), max_n_(max_n) {}
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override;

 private:
  int min_n_, max_n_;
};

// "none" gives nullptr, "ngram" an NgramDrafter; anything else throws InvalidArgument.
std::unique_ptr<Drafter> make_drafter(const std::string& name);
// Throws InvalidArgument unless n >= 1.
void validate_draft_max(int64_t n);

struct GreedyVerdict {
  int accepted = 0;  // drafts equal to the target's argmax
  int32_t next = 0;  // the target's token after the accepted prefix (correction or bonus)
};
// `logits` are rows [drafts.size() + 1, vocab] of the pass over [last, d1 .. dk].
GreedyVerdict verify_greedy(std::span<const float> logits, int64_t vocab,
                            std::span<const int32_t> drafts);

// One deferred target pass over `rows` = [last committed token, d1 .. dk]: logits for every row
// ([rows, vocab]); KDA/conv state stays as it was until Model::commit(state, pending, n).
std::vector<float> verify_pass(Model& model, State& state, std::span<const int32_t> rows,
                               PendingCommit& pending);

struct DraftStats {
  int64_t proposed = 0;
  int64_t accepted = 0;
  int64_t target_passes = 0;  // decode passes (prefill excluded)
  int64_t tokens = 0;         // tokens emitted by those passes
  double acceptance() const { return proposed ? double(accepted) / double(proposed) : 0.0; }
  double tokens_per_pass() const {
    return target_passes ? double(tokens) / double(target_passes) : 0.0;
  }
};

// Greedy generation of up to `max_new` tokens after `prompt` (non-empty), stopping after a token
// in `stop_ids`. With a drafter each decode pass verifies up to `draft_max` drafts; without one
// it is plain greedy decoding. The result is identical either way.
std::vector<int32_t> generate_greedy(Model& model, State& state, std::span<const int32_t> prompt,
                                     int64_t max_new, std::span<const int32_t> stop_ids,
                                     Drafter* drafter, int draft_max, DraftStats* stats = nullptr);

}  // namespace deltafin
