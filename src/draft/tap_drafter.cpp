// The shared drafter shell (see tap_drafter.h): attach, the fallback on failure, argmax.
#include "draft/tap_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
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

LaggedTapDrafter::LaggedTapDrafter(Model& target, TapSpec spec, std::string name,
                                   std::string state_id, int64_t row_width, int64_t feature_width)
    : TapDrafter(target, std::move(spec), std::move(name), std::move(state_id)),
      row_width_(row_width),
      feature_width_(feature_width) {}

void LaggedTapDrafter::reset() {
  replace_cache_rows({}, 0);
  cache_len_ = 0;
  tail_.clear();
}

void LaggedTapDrafter::sync(std::span<const int32_t> committed) {
  if (committed.empty()) return;
  std::vector<int32_t> history(committed.begin(), committed.end());
  history.push_back(0);  // an anchor: committing rows never reads it
  commit_rows(history);
}

int64_t LaggedTapDrafter::first_unheld(int64_t L) {
  const TapRecorder& rec = taps();
  const int64_t held_end = cache_len_ + static_cast<int64_t>(tail_.size()) / feature_width_;
  if (held_end > L) {
    fail("the draft cache holds {} positions but only {} are committed", held_end, L);
  }
  if (rec.end() != L || rec.begin() > held_end) {
    fail(
        "the target's taps cover positions {}..{}, the draft needs {}..{} (a prefix that ran "
        "without this drafter?)",
        rec.begin(), rec.end() - 1, held_end, L - 1);
  }
  return held_end;
}

DraftRows LaggedTapDrafter::export_rows(int64_t from) const {
  const std::span<const float> rows = cache_rows();
  DraftRows r;
  r.width = row_width_;
  r.lag = 1;
  r.begin = std::clamp<int64_t>(from, 0, cache_len_);
  r.rows.assign(rows.begin() + r.begin * row_width_, rows.begin() + cache_len_ * row_width_);
  r.tail = tail_;
  return r;
}

void LaggedTapDrafter::import_rows(const DraftRows& r, int64_t position) {
  const int64_t want = std::max<int64_t>(0, position - 1);
  if (r.width != row_width_ || r.lag != 1 || r.begin != 0 || r.count() != want ||
      static_cast<int64_t>(r.tail.size()) != (position > 0 ? feature_width_ : 0)) {
    fail(
        "the kept draft state does not fit this {} drafter ({} rows of {} floats for {} "
        "positions)",
        name(), r.count(), r.width, position);
  }
  replace_cache_rows(r.rows, want);
  cache_len_ = want;
  tail_ = r.tail;
}

int32_t argmax_row(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace deltafin
