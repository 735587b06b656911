// The reuse policy (see reuse.h).
#include "prefix/reuse.h"

#include <algorithm>

namespace deltafin {

SequenceReuse::SequenceReuse(PrefixStore* store, std::span<const int32_t> prompt,
                             const PromptMarks& marks, State& state, Drafter* drafter)
    : store_(store) {
  if (store_ == nullptr || prompt.empty()) return;
  const auto n = static_cast<int64_t>(prompt.size());
  if (state.position() == 0) restored_ = store_->restore(prompt, n - 1, state, drafter);
  last_ = state.position();  // what the state holds: restored, or kept by the caller
  auto want = [&](int64_t at) {
    if (at > last_ && at < n && !store_->has(prompt.first(static_cast<size_t>(at))))
      cuts_.push_back(at);
  };
  if (marks.system_end >= kSystemMinTokens) want(marks.system_end);
  if (marks.messages_end > 0) want(marks.messages_end);
  if (marks.last_message > 0) want(marks.last_message);
  std::sort(cuts_.begin(), cuts_.end());
  cuts_.erase(std::unique(cuts_.begin(), cuts_.end()), cuts_.end());
}

void SequenceReuse::after_pass(std::span<const int32_t> prompt, const State& state,
                               Drafter* drafter, bool chunk_end) {
  if (store_ == nullptr || !state.consistent()) return;
  const int64_t at = state.position();
  if (at <= last_ || at > static_cast<int64_t>(prompt.size())) return;
  const bool cut = std::binary_search(cuts_.begin(), cuts_.end(), at);
  if (!cut && !(chunk_end && at - last_ >= kSpacingTokens)) return;
  store_->save(prompt.first(static_cast<size_t>(at)), state, drafter);
  last_ = at;
}

void SequenceReuse::at_end(std::span<const int32_t> consumed, const State& state,
                           Drafter* drafter) {
  if (store_ == nullptr || !state.consistent()) return;
  const auto at = static_cast<int64_t>(consumed.size());
  if (at <= last_ || at != state.position()) return;
  store_->save(consumed, state, drafter);
  last_ = at;
}

}  // namespace deltafin
