// The per-format turn parsers behind OutputParser (output_parser.h, which documents what each
// reads and the rules for malformed output). Internal to the tokenizer layer: K3TurnParser is in
// output_parser.cpp, K2TurnParser in output_parser_k2.cpp; OutputParser picks one by the
// tokenizer's chat format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

class TurnParser {
 public:
  virtual ~TurnParser() = default;
  virtual void push(int32_t id, std::vector<ParserEvent>& out) = 0;
  virtual void finish(std::vector<ParserEvent>& out) = 0;
  virtual bool ended() const = 0;
  virtual bool malformed() const = 0;
};

// A turn's visible text as its two streams, reasoning and content, each decoded incrementally (a
// character split over tokens comes out whole). Both parsers route their text through one, and
// flush it whenever their state changes.
class TextStreams {
 public:
  explicit TextStreams(const Tokenizer& tokenizer) : reasoning_(tokenizer), content_(tokenizer) {}
  void emit(std::string_view bytes, bool reasoning, bool malformed, std::vector<ParserEvent>& out);
  void flush(std::vector<ParserEvent>& out);

 private:
  IncrementalDecoder reasoning_, content_;
};

class K3TurnParser final : public TurnParser {
 public:
  // The Tokenizer must have the four K3 markers (else Error).
  K3TurnParser(const Tokenizer& tokenizer, Channel start);

  void push(int32_t id, std::vector<ParserEvent>& out) override;

  void finish(std::vector<ParserEvent>& out) override;
  bool ended() const override { return state_ == State::ended; }
  bool malformed() const override { return malformed_; }

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

  TextStreams text_;
  IncrementalDecoder arg_dec_;

  // The tool call being parsed.
  int call_index_ = -1;
  std::string call_name_;
  std::string call_args_;  // arguments text so far
  bool call_has_members_ = false;
  bool call_malformed_ = false;
  std::string arg_key_, arg_type_, arg_value_;
  bool arg_streaming_ = false;  // string argument: value fragments already emitted
};

class K2TurnParser final : public TurnParser {
 public:
  // The Tokenizer must have <|im_end|> and the five tool-call tokens (else Error); <think>,
  // </think> and [EOS] are used when it has them.
  K2TurnParser(const Tokenizer& tokenizer, Channel start);

  void push(int32_t id, std::vector<ParserEvent>& out) override;
  void finish(std::vector<ParserEvent>& out) override;
  bool ended() const override { return state_ == State::ended; }
  bool malformed() const override { return malformed_; }

 private:
  enum class State {
    reasoning,
    content,
    section,        // inside <|tool_calls_section_begin|>, between calls
    call_id,        // after <|tool_call_begin|>: the id text
    call_args,      // after <|tool_call_argument_begin|>: the arguments text
    after_section,  // after <|tool_calls_section_end|>
    degraded,       // broken structure: the rest is flagged content
    ended,
  };

  bool in_section() const;
  void emit_text(std::string_view bytes, bool malformed, std::vector<ParserEvent>& out);
  void flush_text(std::vector<ParserEvent>& out);
  void set_state(State s, std::vector<ParserEvent>& out);
  void unexpected(std::string raw, std::vector<ParserEvent>& out);
  void begin_call(std::vector<ParserEvent>& out);
  void end_call(bool malformed, std::vector<ParserEvent>& out);
  void close_open_call(std::vector<ParserEvent>& out);
  void end_turn(std::vector<ParserEvent>& out);

  const Tokenizer* tok_;
  int32_t im_end_, section_begin_, section_end_, call_begin_, arg_begin_, call_end_;
  std::optional<int32_t> eos_, think_, think_end_;
  State state_;
  bool malformed_ = false;
  TextStreams text_;
  IncrementalDecoder arg_dec_;

  int call_index_ = -1;
  std::string call_id_;    // the id text so far (raw bytes)
  std::string call_name_;  // from the id
  std::string call_args_;  // the arguments text so far (what the deltas carried)
  bool call_malformed_ = false;
};

// Whether text between two markers is only spaces, tabs and newlines (both parsers let such text
// pass where the format allows none).
bool is_blank(std::string_view s);

}  // namespace deltafin
