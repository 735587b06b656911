// The request fields that enforce the output, read into the constraint a Generation samples
// under (docs/STRUCTURED-OUTPUT.md). One place for every surface: the Chat Completions and
// Completions parsers call these, and the Anthropic, Responses and Ollama translators, the C
// API and Python reach them through those parsers.
//
// Chat: `response_format` (json_schema / json_object), `grammar` (GBNF) and `json_schema` (as
// llama-server takes them) constrain the answer; `tools` with `tool_choice` "required" or a
// named function enforce a call and its arguments; a function with `strict: true` has its
// arguments enforced whenever it is called (with "auto", lazily: free text stays free until the
// model opens a tools block). Completions: `grammar` or `json_schema` over the whole output.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "grammar/constraint.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

// Null when nothing is enforced. Throws ApiError 400 naming the field for what cannot be.
std::shared_ptr<const grammar::Constraint> chat_constraint(const nlohmann::ordered_json& body,
                                                           const ChatRequest& chat,
                                                           const Tokenizer& tok);
std::shared_ptr<const grammar::Constraint> completion_constraint(const nlohmann::ordered_json& body,
                                                                 const Tokenizer& tok);

}  // namespace deltafin::server
