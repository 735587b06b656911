// Target taps: the hidden vectors a draft model reads from the target, per committed row. A
// drafter declares which layers and which stream it was trained on (TapSpec) and attaches a
// TapRecorder to the sequence's State; Model::forward then copies those vectors out of the
// decoder loop for that sequence only, so a model without a drafter pays nothing (one null
// check per pass). Rows of a deferred (verify) pass are staged and reach the recorder's
// committed rows only through Model::commit, for the accepted prefix — the drafter never sees
// the taps of a rejected draft. The recorder keeps committed rows until the drafter consumes
// them, so its memory is the few rows between two proposals, not the context.
//
// Streams (docs/DRAFT-MODELS.md §2):
//   kPartial  the raw within-block Attention-Residual partial sum after layer j (the vector
//             layer j+1 starts from before its own mix; no norm, no banked anchors);
//   kMixture  the AttnRes mixture layer j+1's attention consumes (its MIX over the anchors and
//             the partial, before its input norm), so j must be below the last layer;
//   kFinal    the final-normed hidden the LM head reads (RMSNorm(out; norm), for every row of
//             the pass, not only the rows whose logits are wanted): DeepSeek-V3's MTP layer
//             reads it (docs/FAMILY.md §MTP); its one tap layer is the last layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace deltafin {

enum class TapStream { kPartial, kMixture, kFinal };
const char* tap_stream_name(TapStream s);

struct TapSpec {
  std::vector<int> layers;  // 0-based target layers, in concatenation order
  TapStream stream = TapStream::kPartial;
};

// Throws Error naming `who` (the drafter's config) when a tap layer does not exist in the model
// (or, for the mixture, has no next layer).
void validate_taps(const TapSpec& spec, const ModelConfig& c, const std::string& who);

class TapRecorder {
 public:
  TapRecorder(TapSpec spec, int64_t hidden);
  const TapSpec& spec() const { return spec_; }
  int64_t hidden() const { return hidden_; }
  int64_t width() const { return hidden_ * static_cast<int64_t>(spec_.layers.size()); }

  // Committed rows held: positions [begin(), end()).
  int64_t begin() const { return begin_; }
  int64_t end() const { return begin_ + static_cast<int64_t>(committed_.size()) / width(); }
  // [taps][hidden] of a held position.
  const float* row(int64_t position) const;
  // Drops the rows before `position` (the drafter has used them).
  void consume_until(int64_t position);

  // Model side. stage() opens a pass's rows for positions [base, base + rows) and returns the
  // buffer [rows][taps][hidden] the pass fills; publish(n) commits its first n rows. A pass that
  // starts before end() rewinds the committed rows to it; one that starts after it (a state that
  // ran without this recorder) drops them and restarts at `base`.
  float* stage(int64_t base, int64_t rows);
  void publish(int64_t accepted);
  void truncate(int64_t n);        // drops committed rows at positions >= n
  void clear();                    // an empty sequence again
  void restart(int64_t position);  // no rows held, the next pass starts at `position`

 private:
  TapSpec spec_;
  int64_t hidden_;
  int64_t begin_ = 0;
  std::vector<float> committed_;
  int64_t staged_base_ = 0, staged_rows_ = 0;
  std::vector<float> staged_;
};

}  // namespace deltafin
