// One round of the engine over several sequences: the single place where a forward pass is
// assembled from generations, drafts are proposed and cut, the pass runs, each sequence's rows
// go through the one accept loop (accept_rows) and its state is committed by the rows it
// consumed. The CLI's driver (drive / drive_step: run, chat, bench, the C API) runs rounds of
// one sequence; the server's scheduler runs rounds of every active sequence. So the rule for
// how many drafts to verify, the accounting of drafts and passes, and the order of operations
// exist once (docs/SPECULATIVE.md).
//
// A round:
//   1. decoding sequences keep their rows first (the last sampled token; prompt rows fill what
//      the pass plan leaves, in order, each cut by Generation::limit_input; a prompt that finds
//      no room waits for the next round);
//   2. each decoding sequence with a drafter proposes up to its room (the draft-length setting,
//      the tokens left, and with the automatic length auto_draft_room), and with the automatic
//      length the cost model cuts the proposals jointly (choose_draft_lengths); a constrained
//      sequence's proposal ends at the first token its grammar refuses (a copy of its matcher
//      is advanced through it; accept_rows then masks every verified row);
//   3. one Model::forward over every sequence's rows (verify rows in deferred mode); meanwhile a
//      helper thread computes the grammar masks the rows will need that are still cold
//      (Generation::cold_mask_nodes), so mask work overlaps the pass;
//   4. per sequence: accept_rows, Model::commit by the rows consumed, Drafter::on_verified, the
//      acceptance estimate and the stats; the pass cost is observed when the pass had no
//      prompt rows.
// A pass that throws aborts the generations in it and reports the error for each of them; a
// sequence whose own rows fail reports its error and harms no other.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "generate/draft_length.h"
#include "generate/speculative.h"

namespace deltafin {

class Generation;
class Model;
class State;

// The draft-length setting (`--draft-max`, the server's and the C API's `draft_max`): auto (the
// cost model chooses per pass, up to kAutoDraftMax drafts) or a fixed most-drafts-per-pass.
struct DraftMax {
  bool automatic = true;
  int max = kAutoDraftMax;  // the cap: kAutoDraftMax when automatic
  // "auto" or a number 1..256; throws InvalidArgument naming the setting.
  static DraftMax parse(const std::string& text);
  // The numeric form of the C API, Python and the server options: 0 = auto, else 1..256.
  static DraftMax from_count(int64_t n);
  // Rows a decode pass of one sequence may hold with this setting (1 + the most drafts).
  int64_t verify_rows() const { return 1 + max; }
};

// One sequence's drafting across rounds: its drafter (null: plain decode passes, still counted),
// the draft-length setting, its acceptance estimate and what its decode passes did.
struct DraftConfig {
  Drafter* drafter = nullptr;
  int max = 8;
  bool auto_length = false;
  DraftStats stats;  // accumulated over the decode passes driven
  AcceptanceEstimate acceptance;
  std::optional<PassCostModel> cost;  // made from the model at the first pass when unset
  // The state the drafter was last attached to (Drafter::attach): a round attaches at the first
  // pass on a state, so callers stepping by hand need not.
  const State* attached = nullptr;
  // Decode passes by the number of drafts they verified (index = drafts), for -v.
  std::vector<int64_t> widths;

  void set_max(const DraftMax& m) {
    max = m.max;
    auto_length = m.automatic;
  }
};

// Rows that replace the embedding of some of a sequence's positions (K3's image input: each
// image's projector rows at its <|media_pad|> positions, docs/VISION.md §6): absolute positions
// of the state, strictly increasing, and `width` floats per position in the same order. A pass
// gets the rows of the positions it covers (SequenceInput::embed_rows), so a prompt cut into
// passes anywhere computes what one pass does.
struct PositionRows {
  std::vector<int64_t> positions;
  std::vector<float> values;
  int64_t width = 0;
  bool empty() const { return positions.empty(); }
};

struct RoundSequence {
  State* state = nullptr;
  Generation* gen = nullptr;
  // The ids the state consumed before this generation's prompt (a kept prefix): with the
  // prompt and the completion they are the history a drafter proposes from.
  std::span<const int32_t> before;
  DraftConfig* draft = nullptr;  // null: plain passes, nothing counted
  // Edits each logit row before sampling (logit bias, test scripts).
  std::function<void(std::span<float>)> adjust;
  // Prompt positions at which a prefill pass must end (absolute positions of the state, sorted):
  // the caller takes a snapshot there. Empty: passes are cut only by rows.
  std::span<const int64_t> cut_at;
  // Positions whose input rows are given (images); null or empty: every row embeds its token.
  const PositionRows* embed = nullptr;

  // Filled by the round:
  bool in_pass = false;      // its rows were in this round's pass
  int64_t emitted = 0;       // tokens it sampled
  std::exception_ptr error;  // its pass or its rows failed; the generation was aborted
};

struct RoundReport {
  bool ran = false;  // a pass ran (some sequence had rows)
  int64_t rows = 0, prompt_rows = 0, sequences = 0;
  int64_t generated = 0;  // tokens sampled over all sequences
  // Decoding sequences: drafts proposed and accepted, sequences and tokens.
  int64_t proposed = 0, accepted = 0, decode_sequences = 0, decode_tokens = 0;
  double seconds = 0;                 // the forward pass
  uint64_t bytes_read = 0;            // trunk + expert bytes the pass read
  int64_t mask_nodes_overlapped = 0;  // grammar nodes whose masks were computed during the pass
  std::exception_ptr failure;         // the forward pass itself failed
};

// One round. `pass_rows` caps the pass's rows (0: no cap); `cost` is the shared pass-cost model
// the automatic draft length reads and the round feeds (null: drafts are not cut by cost).
RoundReport run_round(Model& model, std::span<RoundSequence> seqs, int64_t pass_rows,
                      PassCostModel* cost);

}  // namespace deltafin
