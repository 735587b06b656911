// The K2 family's turn parser (docs/FAMILY.md "Parsing model output (K2 family)"): a state
// machine over ids, since every marker is a single token — K2's tokenizer_config flags the five
// tool-call tokens non-special so that decoders keep them as text, but they are still added tokens
// with their own ids, and the parser recognises them by id, never by text. A turn is
//   [<think> REASONING </think>] CONTENT
//   [<|tool_calls_section_begin|>
//      (<|tool_call_begin|> ID <|tool_call_argument_begin|> ARGUMENTS <|tool_call_end|>)*
//    <|tool_calls_section_end|>]
//   <|im_end|>
// with ID `functions.NAME:INDEX`: the function name is what lies between the `functions.` prefix
// and the LAST colon (names may hold dots and colons), and the id itself is reported so that a
// client can send it back (the id is where a replayed call keeps its function's name).
// ARGUMENTS is JSON text, streamed as it is generated (the deltas concatenate to the end event's
// text); blank arguments are `{}`; arguments that are not a JSON object, or an id not of that
// form, flag the call (its text is kept). A section is accepted wherever it starts (also inside
// the think block, which it ends, as K2-Thinking is reported to do), and a second section after
// the first. [EOS] ends the turn like <|im_end|>. Anything else — a role token, <|im_middle|>,
// a stray call token, text inside a section — is kept as flagged content: inside a section the
// open call is ended (flagged) and the rest of the turn is plain content.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/turn_parser.h"
#include "tokenizer/utf8.h"

namespace deltafin {

namespace {

// Longest id text accepted; longer means the model is not writing an id.
constexpr std::size_t kMaxIdBytes = 1024;

int32_t required(const Tokenizer& tok, const char* name) {
  const auto id = tok.special_id(name);
  if (!id) fail("tokenizer has no special token {}, which the K2 output format needs", name);
  return *id;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// `functions.NAME:INDEX` -> NAME; false when the id has another form (NAME is then the best
// guess: the id without the prefix and without a numeric suffix).
bool name_of_id(std::string_view id, std::string& name) {
  static constexpr std::string_view kPrefix = "functions.";
  bool ok = true;
  if (id.substr(0, kPrefix.size()) == kPrefix) {
    id.remove_prefix(kPrefix.size());
  } else {
    ok = false;
  }
  const std::size_t colon = id.rfind(':');
  if (colon != std::string_view::npos && all_digits(id.substr(colon + 1))) {
    id = id.substr(0, colon);
  } else {
    ok = false;
  }
  name = std::string(id);
  return ok && !name.empty();
}

}  // namespace

K2TurnParser::K2TurnParser(const Tokenizer& tokenizer, Channel start)
    : tok_(&tokenizer),
      im_end_(required(tokenizer, "<|im_end|>")),
      section_begin_(required(tokenizer, "<|tool_calls_section_begin|>")),
      section_end_(required(tokenizer, "<|tool_calls_section_end|>")),
      call_begin_(required(tokenizer, "<|tool_call_begin|>")),
      arg_begin_(required(tokenizer, "<|tool_call_argument_begin|>")),
      call_end_(required(tokenizer, "<|tool_call_end|>")),
      eos_(tokenizer.special_id("[EOS]")),
      think_(tokenizer.special_id("<think>")),
      think_end_(tokenizer.special_id("</think>")),
      // Only K2.5's generation prompt opens <think>; K2-Thinking writes it itself.
      state_(tokenizer.chat_format() == ChatFormat::k2_5 && start == Channel::think
                 ? State::reasoning
                 : State::content),
      text_(tokenizer),
      arg_dec_(tokenizer) {}

bool K2TurnParser::in_section() const {
  return state_ == State::section || state_ == State::call_id || state_ == State::call_args ||
         state_ == State::after_section;
}

void K2TurnParser::emit_text(std::string_view bytes, bool malformed,
                             std::vector<ParserEvent>& out) {
  if (malformed) malformed_ = true;
  text_.emit(bytes, state_ == State::reasoning, malformed, out);
}

void K2TurnParser::flush_text(std::vector<ParserEvent>& out) {
  text_.flush(out);
}

void K2TurnParser::set_state(State s, std::vector<ParserEvent>& out) {
  if (s != state_) flush_text(out);
  state_ = s;
}

void K2TurnParser::push(int32_t id, std::vector<ParserEvent>& out) {
  if (state_ == State::ended) return;
  if (id < 0 || id >= tok_->vocab_size()) {  // not model output at all; never throw here
    malformed_ = true;
    return;
  }
  if (id == im_end_ || id == eos_) return end_turn(out);
  const bool special = tok_->is_special(id);
  const std::string_view bytes = tok_->token_bytes(id);
  switch (state_) {
    case State::reasoning:
      if (id == think_end_) return set_state(State::content, out);
      if (id == section_begin_) return set_state(State::section, out);
      if (!special) return emit_text(bytes, false, out);
      break;
    case State::content:
      if (id == think_) return set_state(State::reasoning, out);
      if (id == section_begin_) return set_state(State::section, out);
      if (!special) return emit_text(bytes, false, out);
      break;
    case State::section:
    case State::after_section:
      if (state_ == State::section && id == call_begin_) {
        call_id_.clear();
        state_ = State::call_id;
        return;
      }
      if (state_ == State::section && id == section_end_) {
        state_ = State::after_section;
        return;
      }
      if (state_ == State::after_section && id == section_begin_) {  // a second section
        state_ = State::section;
        return;
      }
      if (!special && is_blank(bytes)) return;  // blank text between markers is fine
      break;
    case State::call_id:
      if (id == arg_begin_) {
        begin_call(out);
        state_ = State::call_args;
        return;
      }
      if (!special) {
        call_id_ += bytes;
        if (call_id_.size() <= kMaxIdBytes) return;
      }
      break;
    case State::call_args:
      if (id == call_end_) {
        end_call(false, out);
        state_ = State::section;
        return;
      }
      if (!special) {
        if (std::string s = arg_dec_.push_bytes(bytes); !s.empty()) {
          call_args_ += s;
          ParserEvent ev{ParserEvent::Kind::tool_call_delta};
          ev.text = std::move(s);
          ev.index = call_index_;
          out.push_back(std::move(ev));
        }
        return;
      }
      break;
    case State::degraded:
      return emit_text(bytes, true, out);
    case State::ended:
      return;
  }
  unexpected(std::string(bytes), out);
}

void K2TurnParser::unexpected(std::string raw, std::vector<ParserEvent>& out) {
  malformed_ = true;
  if (in_section()) {
    if (state_ == State::call_id) {  // an unfinished call header is text, never dropped
      raw = std::string(tok_->token_bytes(call_begin_)) + call_id_ + raw;
      call_id_.clear();
    }
    close_open_call(out);
    set_state(State::degraded, out);
  }
  emit_text(raw, true, out);
}

void K2TurnParser::close_open_call(std::vector<ParserEvent>& out) {
  if (state_ == State::call_args) end_call(true, out);
}

void K2TurnParser::begin_call(std::vector<ParserEvent>& out) {
  ++call_index_;
  const std::string id(trim(utf8::sanitize(call_id_)));
  call_id_ = id;
  call_malformed_ = !name_of_id(id, call_name_);
  call_args_.clear();
  ParserEvent ev{ParserEvent::Kind::tool_call_begin};
  ev.index = call_index_;
  ev.name = call_name_;
  ev.id = id;
  out.push_back(std::move(ev));
}

void K2TurnParser::end_call(bool malformed, std::vector<ParserEvent>& out) {
  std::string tail = arg_dec_.flush();
  if (is_blank(call_args_ + tail)) tail = "{}";  // a call without arguments
  if (!tail.empty()) {
    call_args_ += tail;
    ParserEvent ev{ParserEvent::Kind::tool_call_delta};
    ev.text = std::move(tail);
    ev.index = call_index_;
    out.push_back(std::move(ev));
  }
  const auto parsed = nlohmann::ordered_json::parse(trim(call_args_), nullptr, false);
  const bool bad = malformed || call_malformed_ || !parsed.is_object();
  ParserEvent ev{ParserEvent::Kind::tool_call_end};
  ev.index = call_index_;
  ev.name = call_name_;
  ev.id = call_id_;
  ev.text = std::move(call_args_);
  ev.malformed = bad;
  if (bad) malformed_ = true;
  out.push_back(std::move(ev));
  call_args_.clear();
  call_id_.clear();
  call_malformed_ = false;
}

void K2TurnParser::end_turn(std::vector<ParserEvent>& out) {
  const bool bad = in_section() && state_ != State::after_section;  // a section left open
  if (state_ == State::call_id) {
    unexpected("", out);
  } else {
    close_open_call(out);
  }
  flush_text(out);
  ParserEvent ev{ParserEvent::Kind::end_of_turn};
  ev.malformed = bad;
  if (bad) malformed_ = true;
  out.push_back(std::move(ev));
  state_ = State::ended;
}

void K2TurnParser::finish(std::vector<ParserEvent>& out) {
  if (state_ == State::ended) return;
  if (state_ == State::call_id) {
    unexpected("", out);
  } else if (state_ == State::call_args) {
    end_call(true, out);
    state_ = State::degraded;
  } else if (in_section() && state_ != State::after_section) {
    malformed_ = true;
  }
  flush_text(out);
}

}  // namespace deltafin
