// The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.
//
// A Messages body becomes the equivalent Chat Completions conversation (system blocks -> a
// system message, tool_use blocks -> tool_calls, tool_result blocks -> tool messages, thinking
// blocks -> the assistant's reasoning, which the K3 renderer puts in the think channel), which
// parse_chat_request renders and validates as for /v1/chat/completions; docs/SERVER.md lists
// each field and how it maps. The answer goes back as Anthropic content blocks (thinking, text,
// tool_use with its parsed input), streamed as message_start, content_block_start/delta/stop,
// message_delta and message_stop events, with `ping` events while the prompt is prefilled.
#pragma once

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/wire.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

// Throws ApiError (400 naming the field) for what the Messages API or this server refuses.
Translation anthropic_messages(const nlohmann::ordered_json& body, const ServeLimits& limits,
                               const Tokenizer& tok);

// The Chat Completions body a Messages body translates to (tests compare its rendering); its
// images checked under `images` and written as image_url data-URL parts.
nlohmann::ordered_json anthropic_to_chat(const nlohmann::ordered_json& body, bool count_only,
                                         const ImagePolicy& images = ImagePolicy{});

// {"input_tokens": N}: the prompt the same body would have (max_tokens not needed).
nlohmann::ordered_json anthropic_count_tokens(const nlohmann::ordered_json& body,
                                              const ServeLimits& limits, const Tokenizer& tok);

}  // namespace deltafin::server
