// What the Anthropic, Responses and Ollama translators share: reading the fields of a body with
// errors that name them, and the step every translator ends with — a Chat Completions body
// handed to parse_chat_request, so the K3 rendering, tool declarations, sampling checks and
// server limits are those of /v1/chat/completions, in one place.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/image_parts.h"
#include "server/request.h"
#include "server/response.h"
#include "tokenizer/chat_check.h"

namespace deltafin::server::translate {

using json = nlohmann::ordered_json;

// The value of `key` when present and not null.
const json* field(const json& obj, const char* key);
const char* type_name(const json& v);

// Refuses a key of `obj` that is not in `known`: "PATH.KEY is not supported by this server
// (refusing to silently ignore it)" (PATH empty: the top level).
void only_fields(const json& obj, std::initializer_list<const char*> known,
                 const std::string& path);

// A field of a given type, or 400 naming it ("PATH: expected a string, got number").
const json& need(const json& obj, const char* key, const std::string& path);
std::string string_of(const json& v, const std::string& path);
const json& array_of(const json& v, const std::string& path);
const json& object_of(const json& v, const std::string& path);
std::optional<bool> bool_field(const json& obj, const char* key, const std::string& path);

// The K3 effort for an API's effort name: minimal/low -> low, medium/high -> high, xhigh/max ->
// max. Throws 400 naming `param` for anything else.
std::string k3_effort(const std::string& v, const std::string& param);

// A tool choice that names one tool: K3 cannot be told to call one tool by name, so it is offered
// only that one (`tools`, Chat Completions tools, is cut to it) and must call (`chat`'s
// tool_choice becomes "required"). 400 naming `param` when no tool has that name.
void force_tool(const std::string& name, json& tools, json& chat, const std::string& param);

// A tool call's arguments JSON text as an object (the parser gives a compact JSON object; a
// malformed call's text is kept as {"arguments": TEXT} rather than lost).
json arguments_object(const std::string& text);

// Runs the Chat Completions validation and rendering on `chat`: the ServeRequest the engine runs.
// Its image parts are the checked data URLs of the translator's ImageGate (not checked again).
ServeRequest to_engine(const json& chat, const ServeLimits& limits, const Tokenizer& tok);

// The same with no context or max_tokens ceiling: for counting a prompt's tokens.
ServeRequest to_engine_uncapped(const json& chat, const ServeLimits& limits, const Tokenizer& tok);

}  // namespace deltafin::server::translate
