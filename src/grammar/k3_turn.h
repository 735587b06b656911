// The constraint for one generated assistant turn, in the tokenizer's chat format
// (tok.chat_format()): the structure the output parser reads (tokenizer/output_parser.h), with
// what the request enforces inside it. K3's XTML turn is built here (k3_turn.cpp), the K2
// family's in k2_turn.cpp; TurnSpec is the same for both.
//
// K3:
//   [free thinking] <|close|>think<|sep|> <|open|>response<|sep|>       (when thinking is on)
//   CONTENT <|close|>response<|sep|>
//   [<|open|>tools<|sep|> CALL+ <|close|>tools<|sep|>]
//   <|close|>message<|sep|> <|end_of_msg|>
//   CALL = <|open|>call tool="NAME" index="k"<|sep|> ARGUMENT* <|close|>call<|sep|>
//   ARGUMENT = <|open|>argument key="KEY" type="T"<|sep|> VALUE <|close|>argument<|sep|>
//
// The markers are single special tokens; everything between them is ordinary text. Thinking is
// free text (any ordinary token: only the markers are held to the structure). CONTENT is free
// text, a JSON Schema's value, any JSON object, or a GBNF grammar's language; when a call is
// forced and nothing constrains the content, it is empty (the answer is the call). Each call's
// arguments follow its function's `parameters` schema: one argument tag per property, in the
// schema's order, required ones present, with type "string" (the raw text, as K3 writes string
// arguments), "number" (integers too), "boolean", "null", "object" or "array" as the property's
// schema allows, and the value as that schema allows. A function that is not enforced gets any
// well-formed arguments.
//
// With `lazy`, nothing is constrained until the model opens a tools block
// (`<|open|>tools<|sep|>`, the trigger); the calls and the end of the turn are then enforced.
//
// The K2 family (k2_turn.cpp):
//   [<think> free thinking </think>] CONTENT
//   [<|tool_calls_section_begin|> CALL+ <|tool_calls_section_end|>] <|im_end|>
//   CALL = <|tool_call_begin|> functions.NAME:INDEX <|tool_call_argument_begin|> ARGUMENTS
//          <|tool_call_end|>
// The think block is there when the format thinks and `thinking` is on: K2-Thinking writes
// <think> itself (so the grammar starts with it), K2.5's generation prompt opened it (so the
// grammar starts inside it); K2-Instruct and Kimi-Linear never think. CONTENT is as for K3.
// ARGUMENTS is the JSON text of the function's `parameters` schema when enforced, else any JSON
// object (`{}` for a function without parameters); INDEX is 1 to 6 digits (the model numbers its
// calls across the conversation). With `lazy`, the trigger is <|tool_calls_section_begin|>.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::grammar {

inline constexpr int kMaxToolCalls = 16;  // calls one enforced tools block may hold

struct TurnSpec {
  // Thinking is on for the turn: K3's generation prompt opened `think` (else `response`); K2.5's
  // opened <think>; K2-Thinking writes <think> first; ignored by formats that do not think.
  bool thinking = false;
  enum class Content { free, json_schema, json_object, gbnf };
  Content content = Content::free;
  nlohmann::ordered_json schema;  // json_schema
  std::string gbnf;               // gbnf
  // Tools (OpenAI shape: [{"type":"function","function":{"name","parameters","strict"}}]).
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  enum class Calls { forbidden, optional, required };
  Calls calls = Calls::forbidden;
  std::optional<std::string> named;    // only this function may be called
  bool enforce_all_arguments = false;  // else only `strict` functions' arguments
  bool lazy = false;
  std::string field = "request";  // names the request part in error messages
};

// Compiles the turn of the tokenizer's chat format (through the vocabulary's cache, keyed on the
// format too). Throws InvalidArgument naming the field, keyword and path for what cannot be
// enforced.
Constraint turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer);
// The same function under the name the server and the CLI call it by (it dispatches on the
// format as well).
Constraint k3_turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer);
// The K2-family turn alone (k2_turn.cpp; turn_constraint calls it for the K2 formats).
Constraint k2_turn_constraint(const TurnSpec& spec, const Tokenizer& tokenizer);

// What a spec enforces, in words ("json_schema, tool call required"; "turn structure").
std::string turn_description(const TurnSpec& spec);

// A GBNF grammar or JSON Schema over the whole output (raw completions, `run` without --chat).
Constraint raw_constraint_gbnf(const std::string& gbnf, const Tokenizer& tokenizer);
Constraint raw_constraint_schema(const nlohmann::ordered_json& schema, const Tokenizer& tokenizer,
                                 const std::string& field);

}  // namespace deltafin::grammar
