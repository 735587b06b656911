// The shared drafter shell (see tap_drafter.h): attach, the fallback on failure, argmax.
#include "draft/tap_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "model/state.h"

namespace deltafin {

TapDrafter::TapDrafter(Model& target, TapSpec spec, std::string name, std::string state_id)
    : target_(target),
      rec_(std::make_shared<TapRecorder>(std::move(spec), target.config().hidden)),
      name_(std::move(name)),
      state_id_(std::move(state_id)) {}

void TapDrafter::stop(const std::string& why) {
  why_ = why;
  log_warn("{} drafter: {}; plain decoding for the rest of this request (output unchanged)", name_,
           why_);
}

std::optional<DraftRows> TapDrafter::save(std::span<const int32_t> committed, int64_t from) {
  if (!why_.empty() || rec_->end() != static_cast<int64_t>(committed.size())) return std::nullopt;
  try {
    sync(committed);
    return export_rows(from);
  } catch (const std::exception& e) {
    stop(e.what());
    return std::nullopt;
  }
}

void TapDrafter::restore(State& state, std::span<const int32_t> committed, const DraftRows* rows) {
  const auto n = static_cast<int64_t>(committed.size());
  state.set_taps(rec_);
  rec_->restart(n);
  reset();
  why_.clear();
  if (rows == nullptr) {
    if (n > 0)
      stop(
          fmt::format("the kept prefix of {} tokens this sequence continues has no draft state "
                      "(it was saved without this drafter)",
                      n));
    return;
  }
  try {
    import_rows(*rows, n);
  } catch (const std::exception& e) {
    reset();
    stop(e.what());
  }
}

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
    stop(e.what());
    last_logits_.clear();
    return {};
  }
}

int32_t argmax_row(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace deltafin
