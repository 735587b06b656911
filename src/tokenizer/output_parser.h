// Incremental parser of a generated assistant turn, in the tokenizer's chat format: K3's XTML
// (below) or the K2 family's (OutputParser, further down, says how it is chosen). Both give the
// same events, which the server turns into every API's shapes.
//
// The K3 model writes the same XTML structure the renderer produces for past assistant turns:
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
#include <memory>
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
  // tool_call_begin / tool_call_end: the id the model wrote (K2: `functions.NAME:IDX`, which
  // clients must send back as tool_call.id); empty for K3, whose calls carry no id.
  std::string id;
  bool malformed = false;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // K3: compact JSON object text; K2: the arguments text as written
  bool malformed = false;
  std::string id;  // K2: the call's id as written (trimmed); K3: empty
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
// tokens comes out whole); special tokens are never text (K2's tool-call tokens included, though
// its tokenizer_config flags them non-special: they are structure here); a tag of the tokenizer's
// chat format is structure and is left out whole — K3: <|open|>NAME<|sep|>, <|close|>NAME<|sep|>;
// K2: a message header ROLE_TOKEN NAME <|im_middle|> — and one cut off by the end of the output
// is dropped. A "tag" whose header grows past 1 KiB or meets another special token was not one:
// its header text is shown.
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
  std::vector<int32_t> openers_;  // ids that open a tag header
  std::optional<int32_t> sep_;    // the id that ends one
  bool in_tag_ = false;
  std::vector<int32_t> header_;
  size_t header_bytes_ = 0;
};

class TurnParser;

// The parser of the tokenizer's chat format (tok.chat_format()): K3's XTML reader above, or the
// K2 family's (output_parser_k2.cpp: <think>…</think>, content, the tool-call section with
// `functions.NAME:IDX` ids, <|im_end|>; docs/FAMILY.md "Parsing model output"). `start` says
// whether the turn thinks: for K3 the channel the generation prompt opened; for K2.5 whether
// the prompt opened <think> (then the parser starts in reasoning); K2-Thinking's prompt opens
// nothing (the model writes <think> itself) and K2-Instruct and Kimi-Linear do not think, so
// those start in content and ignore it.
class OutputParser {
 public:
  // The Tokenizer must outlive the parser; it must have its format's markers (else Error).
  OutputParser(const Tokenizer& tokenizer, Channel start);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  // Feeds one generated id; appends the events it completes to `out`.
  void push(int32_t id, std::vector<ParserEvent>& out);
  std::vector<ParserEvent> push(int32_t id);

  // End of the stream (stop or length limit): emits text still held (an incomplete character
  // as U+FFFD) and ends an open tool call (flagged). A tag cut off by the end (`<|open|>response`
  // without its <|sep|>) is structure that never finished: it is dropped, never content.
  void finish(std::vector<ParserEvent>& out);
  std::vector<ParserEvent> finish();

  bool ended() const;
  bool malformed() const;

 private:
  std::unique_ptr<TurnParser> impl_;
};

// Parses a whole generated sequence (push every id, then finish) into one result.
ParsedTurn parse_all(const Tokenizer& tokenizer, std::span<const int32_t> ids, Channel start);

}  // namespace deltafin
