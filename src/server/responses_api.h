// The OpenAI Responses API: POST /v1/responses (what Codex CLI speaks), with `store: false`
// semantics (nothing is kept between requests; `previous_response_id` is refused).
//
// `input` items become the equivalent Chat Completions conversation: `instructions` and
// system/developer messages -> system messages, reasoning items -> the next assistant turn's
// reasoning (K3's think channel), function_call items -> its tool_calls, function_call_output
// items -> tool messages; parse_chat_request renders and validates it as for
// /v1/chat/completions. Tools that are not functions (Codex's web_search, namespaces, ...) are
// left out of the prompt with a log line. The answer goes back as output items — `reasoning`
// (its text as reasoning_text content), `message` with `output_text`, `function_call` with
// `call_id` — and streamed as the response.* events with `sequence_number`.
#pragma once

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/wire.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

// Throws ApiError (400 naming the field) for what the API or this server refuses.
Translation responses_create(const nlohmann::ordered_json& body, const ServeLimits& limits,
                             const Tokenizer& tok);

// The Chat Completions body a Responses body translates to (tests compare its rendering); its
// input_image parts checked under `images` and written as image_url data-URL parts.
nlohmann::ordered_json responses_to_chat(const nlohmann::ordered_json& body,
                                         const ImagePolicy& images = ImagePolicy{});

}  // namespace deltafin::server
