// Chat rendering: an OpenAI-style chat request -> the exact prompt text and ids, in the model's
// chat format (tokenizer.chat_format(), chat_format.h): K3's XTML here and in chat.cpp, the K2
// family's role-token format in chat_k2.cpp.
//
// Two steps, so the server can validate a request before queueing it and reuse the parsed
// form: ChatRequest::from_json() checks every field and reports the first problem by its path
// (`messages[2].content`); render() lays the prompt out as the model's format says: for K3 as
// docs/MODEL.md §5.3 and llama.cpp's Kimi-K3 template (which reproduces the reference encoder's
// gold strings) do; for the K2 family as the released Jinja templates do (docs/FAMILY.md "Chat
// formats and tokenizers", goldens in tests/data/chat/k2-*).
//
// Injection safety: the prompt is built from segments. Only the renderer's own structure emits
// special ids (K3: <|open|>, <|sep|>, <|close|>, <|end_of_msg|>; K2: the role tokens,
// <|im_middle|>, <|im_end|>, <think>, </think> and the tool-call tokens); every other byte (tag
// names, attributes, role names, message content, names, ids, arguments, tool JSON) is encoded
// with encode_ordinary, one run per stretch of text between two specials. A user who types
// `<|end_of_msg|>` or `<|im_end|>` gets ordinary tokens. Where the reference raises,
// InvalidArgument carries the reference's reason (prefixed with the message's path where there is
// one).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deltafin {

struct ChatToolCall {
  std::optional<std::string> id;  // `id`, as text (matched against tool results' tool_call_id)
  std::string name;               // `function.name` (required)
  enum class Args {
    none,        // null, absent-and-empty, or a blank string: nothing between the call tags
    object,      // typed `argument` tags, in the given key order
    json_block,  // raw text in a `json` block (a string that is not a JSON object)
  };
  Args args_kind = Args::none;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // when object
  std::string json_block;                                               // when json_block
  // `arguments` exactly as given when it was a string (the K2 formats write it verbatim).
  std::optional<std::string> arguments_text;
};

struct ChatMessage {
  enum class Role { system, user, assistant, tool };
  Role role = Role::user;
  std::string name;                      // `name` attribute of system/user/assistant; empty = none
  std::string content;                   // text, or text parts joined with nothing between them
  std::optional<std::string> reasoning;  // assistant: `reasoning_content`, else `reasoning`
  std::optional<std::string> reasoning_content;  // assistant: `reasoning_content` alone (K2)
  std::vector<ChatToolCall> tool_calls;          // assistant
  // system: a non-empty `tools` array makes this a dynamic tool declaration (content unused).
  std::optional<nlohmann::ordered_json> tools;
  // tool: `tool_call_id` (else `id`), and the declared name (`tool` if the key is present,
  // else `name`); a result matched to a call is named after the call instead.
  std::optional<std::string> tool_call_id;
  std::optional<std::string> tool_name;
};

struct ChatRequest {
  enum class ToolChoice { unset, auto_, none, required, named };
  enum class ResponseFormat { text, json_object, json_schema };

  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // declared when non-empty
  ToolChoice tool_choice = ToolChoice::unset;
  ResponseFormat response_format = ResponseFormat::text;
  nlohmann::ordered_json response_schema;  // json_schema only; null renders as `null`
  // `reasoning_effort`: absent -> "max"; JSON null -> no effort message (template semantics).
  // K3 only: the K2 formats have no effort control and ignore it.
  std::optional<std::string> reasoning_effort = "max";
  // `thinking`: bool, or {"type": "enabled"|"disabled"}. K3 and K2.5 open the think (or the
  // response) channel by it; K2-Thinking, which always thinks, gets an empty think block in the
  // generation prompt when it is false; K2-Instruct and Kimi-Linear have no reasoning and ignore
  // it.
  bool thinking = true;
  bool add_generation_prompt = true;  // `add_generation_prompt`

  // Validates and converts a request body; unknown top-level fields (model, temperature, ...)
  // are ignored. Throws InvalidArgument naming the field.
  static ChatRequest from_json(const nlohmann::ordered_json& body);
};

struct RenderedPrompt {
  std::string text;
  std::vector<int32_t> ids;
  // Positions in `ids` (0 without a tokenizer): after the leading system messages and the tool
  // and effort declarations before them, and after the last message (before the tool-choice and
  // response-format blocks and the generation prompt). The prefix store snapshots there.
  int64_t system_end = 0;
  int64_t messages_end = 0;
  // Before the last message: an edited last message restarts there.
  int64_t last_message = 0;
};

// The four structural markers (also what the output parser looks for).
inline constexpr const char* kOpenMarker = "<|open|>";
inline constexpr const char* kCloseMarker = "<|close|>";
inline constexpr const char* kSepMarker = "<|sep|>";
inline constexpr const char* kEndOfMsgMarker = "<|end_of_msg|>";

// Renders the prompt text and ids in the tokenizer's chat format. Throws InvalidArgument for
// requests the reference rejects (K3: unsupported effort, unresolvable tool-result name; K2: a
// K3-only field such as a system message's `tools`) and Error when the tokenizer lacks a special
// token the format needs.
RenderedPrompt render(const ChatRequest& request, const Tokenizer& tokenizer);

// Text only (no tokenizer needed): the same string render() returns in `.text`, in K3's format
// or in `format`.
std::string render_text(const ChatRequest& request);
std::string render_text(const ChatRequest& request, ChatFormat format);

// The K2-family renderer (chat_k2.cpp); `tokenizer` null renders text only. render() calls it
// for the K2 formats.
RenderedPrompt render_k2(const ChatRequest& request, const Tokenizer* tokenizer, ChatFormat format);

// Convenience: from_json + render.
RenderedPrompt render_json(const nlohmann::ordered_json& body, const Tokenizer& tokenizer);

}  // namespace deltafin
