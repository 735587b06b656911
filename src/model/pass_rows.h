// The rows of one forward pass and what the decoder loop needs around them (internal to the
// model): the rows grouped by sequence after checking every input (PassRows), the blocks a long
// pass is computed in (pass_plan.h), and where a pass copies the target taps that drafters read
// (model/taps.h). Bookkeeping only: the K3 math is in the layer files and the loop in model.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/layers.h"
#include "model/taps.h"

namespace deltafin {

struct SequenceInput;

// The pass's rows, grouped by sequence, after checking every input.
struct PassRows {
  std::vector<SeqRows> seqs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> logit_rows;  // rows whose logits are returned, in output order
  // Pass rows whose embedding is given (SequenceInput::embed_rows): the row, then its values.
  std::vector<std::pair<int64_t, const float*>> given_rows;
  int64_t count() const { return static_cast<int64_t>(tokens.size()); }
};

// Checks every sequence (a state of this model, consistent, distinct, tokens in the vocabulary
// and the context) and lays out the rows; sizes the records of deferred sequences.
PassRows group_rows(const ModelConfig& c, std::span<SequenceInput> inputs);

// The pass's rows in blocks of at most `block_rows` (pass_plan.h). Blocks are consecutive runs
// of the pass's rows; a sequence is only cut at a multiple of the KDA chunk from its own first
// row, so its chunked recurrence is the one an uncut pass runs. Each part is positioned where
// the previous one left its sequence. Deferred passes (a few drafted rows) stay one block: their
// records are laid out for the whole pass.
struct PassBlock {
  int64_t first = 0;
  std::vector<SeqRows> seqs;
  int64_t rows() const;
};
std::vector<PassBlock> split_blocks(const PassRows& rows, int64_t block_rows);

// Where this pass writes the taps of the sequences whose state has a recorder (model/taps.h).
// With none (no drafter) every call is a test of an empty vector.
class TapCapture {
 public:
  TapCapture(const std::vector<SeqRows>& seqs, int64_t hidden);
  // Copies the rows of `x` into every tap slot that asks for `layer`'s `stream`; `x` holds the
  // pass rows [first, first + n) ([n][hidden]: one block of a blocked prompt pass, or all rows).
  void take(int layer, TapStream stream, const float* x, int64_t first = 0,
            int64_t n_rows = INT64_MAX) const;
  // Whether some sequence of the pass records `stream` (the final-norm tap costs a norm per row).
  bool wants(TapStream stream) const;
  // Rows of plain passes are committed now; a deferred pass's wait for Model::commit.
  void publish() const;

 private:
  struct Out {
    const SeqRows* seq;
    TapRecorder* rec;
    float* buf;
  };
  int64_t H_;
  std::vector<Out> outs_;
};

}  // namespace deltafin
