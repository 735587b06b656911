// The reuse policy of one sequence: the restore before its prompt and the snapshots taken while
// it runs (docs/ARCHITECTURE.md, "Prefix snapshots", gives the costs the policy follows from).
//
// Where snapshots are taken:
//   - at the end of the prompt's messages, before what follows them (the tool-choice and
//     response-format blocks and the generation prompt): the next turn of the conversation starts
//     with these messages whatever the client sends back of the answer, and regenerating the same
//     request prefills only the generation prompt. The prefill pass is cut there, which costs one
//     extra pass of those few rows.
//   - before the last message: a client that edits its last message (or retries it with other
//     words) sends the same conversation up to there, so only the new message is prefilled.
//     Another extra pass of a few rows per request, and one more KDA state per turn kept.
//   - at the end of the leading system messages and tool declarations when they are long (at
//     least kSystemMinTokens) and not kept yet: every conversation with that system prompt
//     starts there. This cut costs one more pass, once per distinct system prompt.
//   - at the end of a prefill pass that ends where the pass plan cut it anyway, when at least
//     kSpacingTokens were prefilled since the last snapshot: free of passes, it bounds what an
//     edit in the middle of a long prompt re-prefills.
//   - when the generation ends: the state after the answer as the model wrote it, which a client
//     that sends the answer back verbatim (with its reasoning) continues exactly.
// Every snapshot costs its KDA state (fixed per snapshot; ~0.5 GB for K3) plus the rows of
// positions no kept snapshot covers yet; a restored position saves its prefill (for K3 on an
// SSD, seconds per prompt token), which is why the cuts above are worth one small extra pass.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "prefix/prefix_store.h"

namespace deltafin {

// Positions in a rendered chat prompt (tokenizer/chat.h RenderedPrompt), 0 where absent.
struct PromptMarks {
  int64_t system_end = 0;    // after the leading system messages and tool declarations
  int64_t messages_end = 0;  // after the last message
  int64_t last_message = 0;  // before the last message
};

constexpr int64_t kSystemMinTokens = 64;
constexpr int64_t kSpacingTokens = 1024;

class SequenceReuse {
 public:
  // Restores into an empty `state` (and `drafter`) the deepest snapshot of `prompt` that leaves
  // at least one token to feed, and plans the cut positions. A state that already holds a prefix
  // of the prompt (a chat session's kept state) is kept as it is. No store: nothing restored, no
  // cuts.
  SequenceReuse(PrefixStore* store, std::span<const int32_t> prompt, const PromptMarks& marks,
                State& state, Drafter* drafter);

  const Restored& restored() const { return restored_; }
  // Absolute positions at which prefill passes must end (sorted; for RoundSequence::cut_at).
  std::span<const int64_t> cuts() const { return cuts_; }
  // After a pass: `ids` are the prompt ids (the state consumed a prefix of them); snapshots a
  // cut it reached, or a long enough stretch since the last snapshot when the pass ended where
  // the prefill chunk ends (`chunk_end`).
  void after_pass(std::span<const int32_t> prompt, const State& state, Drafter* drafter,
                  bool chunk_end);
  // When the generation ended: `consumed` are every id the state consumed.
  void at_end(std::span<const int32_t> consumed, const State& state, Drafter* drafter);

 private:
  PrefixStore* store_;
  Restored restored_;
  std::vector<int64_t> cuts_;
  int64_t last_ = 0;  // the position of the last snapshot taken or restored
};

}  // namespace deltafin
