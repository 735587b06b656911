// The one validator of an OpenAI chat request body's structure, shared by the server and
// `deltafin render`, so that what one accepts the other accepts too.
//
// ChatRequest::from_json reads what the K3 renderer needs and mirrors the reference renderer,
// which renders some bodies the OpenAI API refuses (a tool without a function, `tool_choice:
// "required"` with no tools). This check runs first and refuses those with the field's path and
// what was expected: tools (type "function", a function object with a name, `parameters` an
// object), tool_choice "required" only with tools, response_format json_schema with its
// json_schema object, messages (objects with known fields, text content parts — and image parts
// where the caller takes images —, content
// present where the role needs it) and the limits on their counts.
//
// Per chat format: the K2 formats have no tool declaration inside a system message (K3's dynamic
// declaration), so `messages[i].tools` is refused there, and a system message always needs its
// content.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_format.h"

namespace deltafin {

// Limits on what one request may list (docs/SERVER.md names them).
inline constexpr size_t kMaxMessages = 4096;
inline constexpr size_t kMaxTools = 256;

// Throws InvalidArgument "PATH: what is wrong (expected ...)" for the first problem, by the
// rules of `format` (the model's: tok.chat_format()); without one, K3's.
// `images`: the caller renders image parts (a model with a vision tower measures them, K3's
// format): `image_url` / `image` parts are left to the renderer's checks (docs/VISION.md §11.7);
// otherwise they are refused here like every part that is not text.
void check_chat_body(const nlohmann::ordered_json& body, ChatFormat format, bool images = false);
void check_chat_body(const nlohmann::ordered_json& body);

}  // namespace deltafin
