// The shared drafter shell (see tap_drafter.h): attach, the fallback on failure, argmax.
#include "draft/tap_drafter.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "model/state.h"

namespace deltafin {

TapDrafter::TapDrafter(Model& target, TapSpec spec, std::string name)
    : target_(target),
      rec_(std::make_shared<TapRecorder>(std::move(spec), target.config().hidden)),
      name_(std::move(name)) {}

void TapDrafter::attach(State& state) {
  // A new sequence, or a state this drafter did not follow: start over. The same state again
  // (a later chat turn) keeps the draft cache in step with the recorder.
  if (state.taps() == rec_.get() && state.position() > 0) return;
  rec_->clear();
  state.set_taps(rec_);
  reset();
  why_.clear();
}

DraftProposal TapDrafter::propose(std::span<const int32_t> history, int max_tokens) {
  last_logits_.clear();
  if (!why_.empty() || max_tokens <= 0 || history.size() < 2) return {};
  try {
    return draft(history, max_tokens);
  } catch (const std::exception& e) {
    why_ = e.what();
    log_warn("{} drafter: {}; plain decoding for the rest of this request (output unchanged)",
             name_, why_);
    last_logits_.clear();
    return {};
  }
}

int32_t argmax_row(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace deltafin
