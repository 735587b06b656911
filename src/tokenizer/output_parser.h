// Incremental parser of a generated K3 assistant turn.
//
// The model writes the same XTML structure the renderer produces for past assistant turns:
//   [reasoning] <|close|>think<|sep|> <|open|>response<|sep|> [content] <|close|>response<|sep|>
//   [<|open|>tools<|sep|> (<|open|>call tool="NAME" index="k"<|sep|>
//        (<|open|>argument key="K" type="T"<|sep|> VALUE <|close|>argument<|sep|>)*
//        | <|open|>json type="object"<|sep|> RAW <|close|>json<|sep|>
//    <|close|>call<|sep|>)* <|close|>tools<|sep|>]
//   <|close|>message<|sep|> <|end_of_msg|>
// The generation prompt has already opened `think` (thinking on) or `response` (thinking off),
// so the parser starts in that channel. It is fed one id at a time and returns events as soon
// as they are known, so a server can stream them:
//  * reasoning / content: UTF-8-safe text deltas (an IncrementalDecoder per channel; a
//    character split across tokens comes out whole);
//  * tool_call_begin (name) when a call header is complete; tool_call_delta with the next
//    fragment of the arguments JSON (a string argument streams as it is generated, other types
//    when their value is complete); tool_call_end with the whole arguments text. The fragments
//    concatenate to exactly that text: a compact JSON object, keys in generated order,
//    string values raw, number/boolean/null/object/array values parsed;
//  * end_of_turn on <|end_of_msg|> (after <|close|>message<|sep|> or alone).
//
// Malformed output never throws. Tags the current state does not expect, stray specials and
// unfinished tag headers become plain text of the current channel (specials spelled as their
// names) with `malformed` set; a tag header cut off by the end of the output is dropped.
// Inside the tools block, where plain text has no place, the open call is ended (flagged), the
// offending text goes to the content channel and the rest of the turn is plain content (only
// <|close|>message<|sep|> and <|end_of_msg|> keep their meaning). A non-string argument whose value
// does not parse as its declared type is kept as a string value and flags the call; a `json` block
// that is not a JSON object goes to the content channel as text and flags the call. Ids after the
// end of the turn are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deltafin {

enum class Channel { think, response };

struct ParserEvent {
  enum class Kind {
    reasoning,
    content,
    tool_call_begin,
    tool_call_delta,
    tool_call_end,
    end_of_turn
  };
  Kind kind;
  std::string text;  // reasoning/content: the delta; tool_call_delta: arguments fragment;
                     // tool_call_end: the complete arguments JSON
  int index = -1;    // tool calls: 0-based position of the call in this turn
  std::string name;  // tool_call_begin / tool_call_end: the tool name
  bool malformed = false;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON object text
  bool malformed = false;
};

struct ParsedTurn {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool ended = false;      // <|end_of_msg|> was seen
  bool malformed = false;  // any event was flagged
};

// Raw (not chat) output as text: what `run` without --chat, /v1/completions and plain
// generation through the C API show. Ordinary tokens are decoded (a character split across
// tokens comes out whole); special tokens are never text; a K3 tag (<|open|>NAME<|sep|>,
// <|close|>NAME<|sep|>) is structure and is left out whole, and one cut off by the end of the
// output is dropped. A "tag" whose header grows past 1 KiB or meets another special token was
// not one: its header text is shown.
class PlainTextFilter {
 public:
  explicit PlainTextFilter(const Tokenizer& tokenizer);
  std::string push(int32_t id);
  // The end of the output: an incomplete character becomes U+FFFD, an unfinished tag is dropped.
  std::string finish();

 private:
  std::string flush_header();

  const Tokenizer* tok_;
  IncrementalDecoder dec_;
  std::optional<int32_t> open_, close_, sep_;
  bool in_tag_ = false;
  std::vector<int32_t> header_;
  size_t header_bytes_ = 0;
};

class OutputParser {
 public:
  // The Tokenizer must outlive the parser; it must have the four K3 markers (else Error).
  OutputParser(const Tokenizer& tokenizer, Channel start);

  // Feeds one generated id; appends the events it completes to `out`.
  void push(int32_t id, std::vector<ParserEvent>& out);
  std::vector<ParserEvent> push(int32_t id);

  // End of the stream (stop or length limit): emits text still held (an incomplete character
  // as U+FFFD) and ends an open tool call (flagged). A tag cut off by the end (`<|open|>response`
  // without its <|sep|>) is structure that never finished: it is dropped, never content.
  void finish(std::vector<ParserEvent>& out);
  std::vector<ParserEvent> finish();

  bool ended() const { return state_ == State::ended; }
  bool malformed() const { return malformed_; }

 private:
  enum class State {
    think,
    response,
    between,
    tools,
    call,
    argument,
    json_block,
    after_message,
    degraded,
    ended,
  };
  enum class TagKind { open, close };

  void handle_text(int32_t id, std::vector<ParserEvent>& out);
  void handle_tag(std::vector<ParserEvent>& out);
  void handle_end_of_msg(std::vector<ParserEvent>& out);
  void unexpected(std::string raw, std::vector<ParserEvent>& out);
  void abandon_pending(std::vector<ParserEvent>& out);
  void emit_text(std::string_view bytes, bool malformed, std::vector<ParserEvent>& out);
  void flush_text(std::vector<ParserEvent>& out);
  void set_state(State s, std::vector<ParserEvent>& out);
  void begin_call(std::string name, std::vector<ParserEvent>& out);
  void add_member(std::string fragment_without_separator, std::vector<ParserEvent>& out);
  void finish_argument(std::vector<ParserEvent>& out);
  void end_call(bool malformed, std::vector<ParserEvent>& out);
  void delta(std::string fragment, std::vector<ParserEvent>& out);
  void degrade(std::string raw, std::vector<ParserEvent>& out);
  void close_open_call(std::vector<ParserEvent>& out);
  bool in_call_states() const;

  const Tokenizer* tok_;
  int32_t open_id_, close_id_, sep_id_, eom_id_;
  State state_;
  bool malformed_ = false;

  // A tag being read: <|open|> or <|close|>, then header text until <|sep|>.
  bool pending_ = false;
  TagKind pending_kind_ = TagKind::open;
  std::vector<int32_t> pending_ids_;
  std::string pending_header_;

  IncrementalDecoder reasoning_dec_, content_dec_, arg_dec_;

  // The tool call being parsed.
  int call_index_ = -1;
  std::string call_name_;
  std::string call_args_;  // arguments text so far
  bool call_has_members_ = false;
  bool call_malformed_ = false;
  std::string arg_key_, arg_type_, arg_value_;
  bool arg_streaming_ = false;  // string argument: value fragments already emitted
};

// Parses a whole generated sequence (push every id, then finish) into one result.
ParsedTurn parse_all(const Tokenizer& tokenizer, std::span<const int32_t> ids, Channel start);

}  // namespace deltafin
