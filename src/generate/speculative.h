// Speculative decoding that never changes K3's output. A Drafter proposes up to k tokens from a
// sequence's committed history (optionally with its draft distributions q); one deferred pass
// (SequenceInput::pending) verifies [last committed token, d1 .. dk]; Model::commit advances the
// KDA/conv state by the accepted rows only and truncates the MLA cache. Greedy verification
// accepts the longest prefix that equals the target's argmax and then emits the target's own
// token, so the completion is the one plain greedy decoding gives, token for token.
// Verification lives here, in src/generate, so src/model only supplies the deferred pass and
// the commit.
//
// Sampling: a deterministic drafter (no q) has its draft kept while it equals the token the
// row samples, with the sampler's usual draws, so seeded output equals plain decoding's. A
// drafter that gives q has each draft judged by speculative rejection sampling
// (Sampler::verify_draft): the distribution is unchanged, the draws differ from plain decoding.
// accept_rows() is the one accept loop: drive() (run, chat, bench) and the server's
// scheduler both feed their verify rows through it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace deltafin {

class Model;
class State;
class Generation;
struct PendingCommit;

struct DraftProposal {
  std::vector<int32_t> tokens;
  // Draft distributions, one [vocab] row per token, or empty for a deterministic drafter
  // (q is then one-hot at the token).
  std::vector<std::vector<float>> q;
  // Optional: the drafter's estimate that each draft is accepted given the ones before it
  // (DSpark gives one); the draft-length choice uses it in place of the measured rate.
  std::vector<float> confidence;
};

// What a drafter keeps of one sequence besides its history (a draft model's cache), in the form
// a prefix store keeps it (docs/ARCHITECTURE.md, "Prefix snapshots"): one row of `width` floats
// per position, for positions [0, position - lag) (an EAGLE row p needs token p + 1, so its rows
// lag the sequence by one; DSpark's do not), and a tail the next proposal continues from.
struct DraftRows {
  int64_t width = 0;
  int64_t lag = 0;
  int64_t begin = 0;        // the first position `rows` holds
  std::vector<float> rows;  // [positions][width]
  std::vector<float> tail;  // e.g. EAGLE's pending fused feature of the last position
  int64_t count() const { return width > 0 ? static_cast<int64_t>(rows.size()) / width : 0; }
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

  // Prefix snapshots. A drafter whose proposals need more than the history (a draft model's
  // cache, built from the target's taps) keeps state: save() first brings it up to date with
  // `committed` (every id the sequence's state consumed) and returns its rows from position
  // `from` on and its tail; restore() continues a sequence whose target state was restored at
  // committed.size() from rows [0, position - lag) and a tail, attaching to `state` so the next
  // passes record taps from there. A drafter that cannot (it fell back to plain decoding) returns
  // nothing from save(); restore() with rows it cannot use makes it say why and stop drafting
  // that sequence (the output never depends on it).
  virtual bool keeps_state() const { return false; }
  virtual std::optional<DraftRows> save(std::span<const int32_t> /*committed*/, int64_t /*from*/) {
    return std::nullopt;
  }
  virtual void restore(State& /*state*/, std::span<const int32_t> /*committed*/,
                       const DraftRows* /*rows*/) {}
  // Identifies what a drafter's rows mean (kind and weights), so rows saved by another drafter
  // are never restored into this one; "" for drafters without state.
  virtual std::string state_id() const { return ""; }
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

// A test aid (`--draft replay:FILE`): proposes what follows the history's tail in a known token
// sequence (FILE: ids separated by spaces, commas or newlines, e.g. a plain run's prompt and
// completion ids), with every `wrong_every`-th proposed token replaced by a wrong one (0:
// never), so binary-level tests reach fully, partly and never accepted drafts.
class ReplayDrafter : public Drafter {
 public:
  ReplayDrafter(std::vector<int32_t> known, int wrong_every, int64_t vocab);
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) override;

 private:
  std::vector<int32_t> known_;
  int wrong_every_;
  int64_t vocab_;
  int64_t count_ = 0;
};

// What a drafter may need to be built; a struct so fields can be added (a draft model's
// checkpoint, say) without changing make_drafter's callers.
struct DrafterContext {
  int64_t vocab = 0;       // the target's vocabulary
  Model* model = nullptr;  // the target, when the drafter needs it (draft models tap it)
};

// The drafters that need no model of their own: "none" gives nullptr, "ngram" an NgramDrafter,
// "replay:FILE" / "replay/N:FILE" a ReplayDrafter (every N-th draft wrong). "mtp" (the target's
// own MTP layer, draft/mtp.h) and a draft model folder (EAGLE-3.x, DSpark) live in a layer above
// this one and is opened once by the load path (runtime/load.h), which hands each sequence its own
// drafter: here a folder is only checked (it must hold a config.json) and nullptr returned when
// `ctx.model` is null. Anything else throws InvalidArgument naming the spec and what was expected.
std::unique_ptr<Drafter> make_drafter(const std::string& spec, const DrafterContext& ctx = {});
// The cap on drafts per pass when the cost model chooses (`--draft-max auto`; the setting is
// parsed once, by DraftMax in round.h).
constexpr int kAutoDraftMax = 16;

struct DraftStats {
  int64_t proposed = 0;
  int64_t accepted = 0;
  int64_t target_passes = 0;  // decode passes (prefill excluded)
  int64_t tokens = 0;         // tokens emitted by those passes
  uint64_t bytes_read = 0;    // trunk + expert bytes read by those passes
  double acceptance() const { return proposed ? double(accepted) / double(proposed) : 0.0; }
  double tokens_per_pass() const {
    return target_passes ? double(tokens) / double(target_passes) : 0.0;
  }
  double bytes_per_token() const { return tokens ? double(bytes_read) / double(tokens) : 0.0; }
  DraftStats& operator+=(const DraftStats& o);
};

struct RowsVerdict {
  int64_t fed = 0;   // rows the generation consumed: commit the state by this many
  int accepted = 0;  // drafts emitted
  int64_t tokens = 0;
};
// Feeds `gen` the logit rows of its verify pass over [gen.next_input(), d1 .. dk] (`logits`:
// [1 + k, vocab]; `adjust`, when set, edits a row first, e.g. the server's logit_bias) while the
// token each row gives is the draft that follows it. Every row is sampled exactly as a plain
// pass's would be (see the file comment), so what the generation emits does not depend on
// the drafts.
RowsVerdict accept_rows(Generation& gen, std::span<float> logits, int64_t vocab,
                        const DraftProposal& d,
                        const std::function<void(std::span<float>)>& adjust = {});

}  // namespace deltafin
