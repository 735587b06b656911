#include "generate/generation.h"

#include <algorithm>
#include <limits>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/timer.h"

namespace deltafin {

constexpr EnumName<StopReason> kStopReasonNames[] = {
    {StopReason::kNone, "none"},
    {StopReason::kLength, "length"},
    {StopReason::kContext, "context"},
    {StopReason::kStopToken, "stop_token"},
    {StopReason::kEndOfTurn, "end_of_turn"},
    {StopReason::kStopString, "stop_string"},
    {StopReason::kCancelled, "cancelled"},
};

const char* stop_reason_name(StopReason r) {
  return name_of(kStopReasonNames, r);
}

Generation::Generation(std::vector<int32_t> prompt, const GenerationParams& params,
                       const Tokenizer* tokenizer, int64_t vocab, int64_t start_position)
    : prompt_(std::move(prompt)),
      params_(params),
      tok_(tokenizer),
      sampler_(params.sampling, vocab),
      position_(start_position) {
  if (prompt_.empty()) fail_arg("generation needs at least one prompt token");
  if (params_.max_new_tokens < 0) fail_arg("max new tokens must be >= 0");
  if (params_.prefill_chunk < 1) params_.prefill_chunk = 1;
  for (const auto& s : params_.stop_strings) {
    if (s.empty()) fail_arg("stop strings must not be empty");
    max_stop_ = std::max(max_stop_, s.size());
  }
  if (tok_ != nullptr) {
    if (params_.chat) {
      parser_.emplace(*tok_, params_.start_channel);
    } else {
      plain_.emplace(*tok_);
    }
  } else if (params_.chat) {
    fail_arg("chat mode needs a tokenizer");
  }
  if (params_.constraint)
    matcher_.emplace(params_.constraint->grammar, params_.stop_ids, params_.constraint->trigger);
  timing_.start = now_seconds();
  timing_.prompt_tokens = static_cast<int64_t>(prompt_.size());
  if (params_.context_limit > 0 &&
      position_ + static_cast<int64_t>(prompt_.size()) > params_.context_limit) {
    fail_arg("the prompt needs {} positions but the context is {}", position_ + prompt_.size(),
             params_.context_limit);
  }
  const int64_t n = std::min<int64_t>(params_.prefill_chunk, static_cast<int64_t>(prompt_.size()));
  input_.assign(prompt_.begin(), prompt_.begin() + n);
  if (params_.max_new_tokens == 0) {
    // Nothing to generate: the prompt is still consumed so the state reflects it.
  }
}

Generation::Generation(std::vector<int32_t> prompt, const GenerationParams& params,
                       const Tokenizer* tokenizer, int64_t vocab,
                       std::span<const int32_t> preceding)
    : Generation(std::move(prompt), params, tokenizer, vocab,
                 static_cast<int64_t>(preceding.size())) {
  if (prompt_.size() >= Sampler::kRepeatWindow) return;  // the prompt fills the window
  const size_t from =
      preceding.size() - std::min(preceding.size(), Sampler::kRepeatWindow - prompt_.size());
  window_.assign(preceding.begin() + static_cast<ptrdiff_t>(from), preceding.end());
  window_.insert(window_.end(), prompt_.begin(), prompt_.end());
}

std::span<const int32_t> Generation::next_input() const {
  if (finished()) return {};
  return input_;
}

void Generation::limit_input(int64_t rows) {
  if (!in_prefill() || rows < 1 || static_cast<int64_t>(input_.size()) <= rows) return;
  input_.resize(static_cast<size_t>(rows));  // input_ is prompt_[fed_, ...): consume() goes on
}

std::optional<int32_t> Generation::unconsumed_token() const {
  if (tokens_.empty() || last_consumed_) return std::nullopt;
  return tokens_.back().id;
}

std::vector<int32_t> Generation::completion_ids() const {
  std::vector<int32_t> ids;
  for (const auto& t : tokens_) ids.push_back(t.id);
  return ids;
}

std::vector<ParserEvent> Generation::take_events() {
  std::vector<ParserEvent> out;
  out.swap(events_);
  return out;
}

void Generation::emit(ParserEvent e) {
  if (e.malformed) malformed_ = true;
  switch (e.kind) {
    case ParserEvent::Kind::content:
      handle_content(std::move(e.text));
      return;
    case ParserEvent::Kind::reasoning:
      if (e.text.empty()) return;
      reasoning_ += e.text;
      break;
    case ParserEvent::Kind::tool_call_end:
      tool_calls_.push_back({e.name, e.text, e.malformed});
      break;
    default:
      break;
  }
  events_.push_back(std::move(e));
}

void Generation::handle_content(std::string delta) {
  if (delta.empty() || stop_ == StopReason::kStopString) return;
  held_ += delta;
  if (max_stop_ > 0) {
    // Earliest stop-string match in held text (held never contains a complete match).
    size_t best = std::string::npos;
    for (const auto& s : params_.stop_strings) {
      const size_t at = held_.find(s);
      if (at < best || (at == best && at != std::string::npos && s.size() > stop_string_.size())) {
        best = at;
        stop_string_ = s;
      }
    }
    if (best != std::string::npos) {
      std::string out = held_.substr(0, best);
      held_.clear();
      content_ += out;
      if (!out.empty()) events_.push_back({ParserEvent::Kind::content, std::move(out)});
      finish(StopReason::kStopString);
      return;
    }
    // Hold back the longest suffix that is a prefix of some stop string.
    size_t hold = 0;
    for (const auto& s : params_.stop_strings) {
      for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    std::string out = held_.substr(0, held_.size() - hold);
    held_.erase(0, held_.size() - hold);
    content_ += out;
    if (!out.empty()) events_.push_back({ParserEvent::Kind::content, std::move(out)});
    return;
  }
  content_ += held_;
  events_.push_back({ParserEvent::Kind::content, std::move(held_)});
  held_.clear();
}

void Generation::finish(StopReason r) {
  if (stop_ != StopReason::kNone) return;
  // Flush what the decoders still hold, then any held-back content (it was not a stop string).
  if (r != StopReason::kStopString) {
    if (parser_) {
      for (auto& e : parser_->finish()) emit(std::move(e));
    } else if (plain_) {
      handle_content(plain_->finish());
    }
    if (stop_ == StopReason::kNone && !held_.empty()) {
      content_ += held_;
      events_.push_back({ParserEvent::Kind::content, std::move(held_)});
      held_.clear();
    }
  }
  if (stop_ == StopReason::kNone) stop_ = r;
  input_.clear();
}

size_t Generation::allowed_drafts(std::span<const int32_t> drafts) const {
  if (!matcher_) return drafts.size();
  grammar::Matcher m = *matcher_;
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!m.accept(drafts[i])) return i;
    if (m.finished()) return i + 1;
  }
  return drafts.size();
}

grammar::ColdNodes Generation::cold_mask_nodes(std::span<const int32_t> drafts) const {
  if (!matcher_ || finished() || tokens_left() <= 0) return {};
  const int64_t fed_after = fed_ + static_cast<int64_t>(input_.size());
  if (in_prefill() && fed_after < prompt_size()) return {};  // a prompt chunk samples nothing
  return matcher_->cold_nodes(drafts);
}

bool Generation::constraint_unfinished() const {
  return matcher_ && matcher_->active() && !matcher_->complete() && !matcher_->finished() &&
         (stop_ == StopReason::kLength || stop_ == StopReason::kContext);
}

void Generation::cancel() {
  finish(StopReason::kCancelled);
}

void Generation::abort(StopReason reason) {
  if (stop_ == StopReason::kNone) stop_ = reason;
  input_.clear();
}

void Generation::on_logits(std::span<const float> logits) {
  consume(logits, nullptr, {}, nullptr);
}

bool Generation::on_draft_logits(std::span<const float> logits, int32_t draft,
                                 std::span<const float> q) {
  bool accepted = false;
  consume(logits, &draft, q, &accepted);
  return accepted;
}

void Generation::consume(std::span<const float> logits, const int32_t* draft,
                         std::span<const float> q, bool* accepted) {
  if (finished()) return;
  const int64_t n_in = static_cast<int64_t>(input_.size());
  consumed_ += n_in;
  position_ += n_in;
  if (in_prefill()) {
    fed_ += n_in;
    if (in_prefill()) {  // more prompt to go; these logits are not needed
      const int64_t n =
          std::min<int64_t>(params_.prefill_chunk, static_cast<int64_t>(prompt_.size()) - fed_);
      input_.assign(prompt_.begin() + fed_, prompt_.begin() + fed_ + n);
      return;
    }
    timing_.prefill_done = now_seconds();
  }
  last_consumed_ = true;
  if (static_cast<int64_t>(tokens_.size()) >= params_.max_new_tokens) {
    finish(StopReason::kLength);
    return;
  }
  const grammar::TokenMask* allowed = nullptr;
  if (matcher_ && matcher_->active()) {
    const double t0 = now_seconds();
    matcher_->fill_mask(mask_);
    timing_.mask_s += now_seconds() - t0;
    if (mask_.count() == 0) {
      // The grammar has ended and there is no stop token to say so: the output is complete.
      finish(StopReason::kStopToken);
      return;
    }
    allowed = &mask_;
  }
  const std::span<const int32_t> recent =
      window_.empty() ? std::span<const int32_t>(prompt_) : std::span<const int32_t>(window_);
  int32_t id;
  if (draft != nullptr && !q.empty()) {
    id = sampler_.verify_draft(logits, recent, generated_ids_, *draft, q, *accepted, allowed);
  } else {
    id = sampler_.sample(logits, recent, generated_ids_, allowed);
    if (draft != nullptr) *accepted = id == *draft;
  }
  if (matcher_) {
    const double t0 = now_seconds();
    if (!matcher_->accept(id)) fail("generation: the grammar refused token {} it allowed", id);
    timing_.mask_s += now_seconds() - t0;
  }
  GeneratedToken t;
  t.id = id;
  if (params_.top_logprobs >= 0) {
    // With a grammar, the logprobs of the distribution sampled from (the allowed tokens).
    std::span<const float> shown = logits;
    std::vector<float> masked;
    if (allowed != nullptr) {
      masked.assign(logits.begin(), logits.end());
      for (size_t i = 0; i < masked.size(); ++i) {
        if (!allowed->test(static_cast<int32_t>(i)))
          masked[i] = -std::numeric_limits<float>::infinity();
      }
      shown = masked;
    }
    t.chosen = logprob_of(shown, id);
    t.top = top_logprobs(shown, params_.top_logprobs);
  }
  tokens_.push_back(std::move(t));
  generated_ids_.push_back(id);
  last_consumed_ = false;
  const double now = now_seconds();
  if (tokens_.size() == 1) timing_.first_token = now;
  timing_.last_token = now;

  const bool is_stop_id =
      std::find(params_.stop_ids.begin(), params_.stop_ids.end(), id) != params_.stop_ids.end();
  if (parser_) {
    for (auto& e : parser_->push(id)) emit(std::move(e));
    if (stop_ != StopReason::kNone) return;  // a stop string matched
    if (parser_->ended()) {
      finish(StopReason::kEndOfTurn);
      return;
    }
  } else if (plain_ && !is_stop_id) {
    handle_content(plain_->push(id));
    if (stop_ != StopReason::kNone) return;
  }
  if (is_stop_id) {
    finish(parser_ ? StopReason::kEndOfTurn : StopReason::kStopToken);
    return;
  }
  if (static_cast<int64_t>(tokens_.size()) >= params_.max_new_tokens) {
    finish(StopReason::kLength);
    return;
  }
  if (params_.context_limit > 0 && position_ + 1 > params_.context_limit) {
    finish(StopReason::kContext);
    return;
  }
  input_.assign(1, id);
}

}  // namespace deltafin
