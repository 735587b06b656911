// The Ollama API, as Ollama documents it, for the front ends and libraries that speak it (Open
// WebUI, the `ollama` JavaScript and Python libraries, editor plug-ins):
//   GET /api/version, /api/tags, /api/ps; POST /api/show — the served model and its context;
//   POST /api/chat and /api/generate — NDJSON streams by default (`stream: false` for one
//     object), `options` mapped onto the sampling settings, `think`, `tools`, `format` ("json"
//     or a JSON schema), `keep_alive` accepted (the model stays loaded for the server's life);
//   POST /api/embed (and the older /api/embeddings) — refused: K3 has no embedding output.
// /api/chat is translated into the equivalent Chat Completions conversation; /api/generate into
// a one-turn chat (`system` + `prompt`), or with `raw: true` into a plain completion of the prompt
// text. Errors are Ollama's {"error": "message"}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/request.h"
#include "server/wire.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

// The answer to a model-information route (`route` is "/api/version", "/api/tags", "/api/ps",
// "/api/show", "/api/embed" or "/api/embeddings"; `body` the raw request body). `served.context`
// is 0 while the model loads. Throws ApiError.
nlohmann::ordered_json ollama_info(const std::string& route, const std::string& body,
                                   const ServeLimits& served, int64_t created);

// /api/generate without a prompt, /api/chat without messages: Ollama's way to load a model;
// answered at once with done_reason "load" (the model is loaded for the server's life).
std::optional<nlohmann::ordered_json> ollama_load_only(bool chat,
                                                       const nlohmann::ordered_json& body,
                                                       const ServeLimits& limits);

// /api/chat (chat = true) or /api/generate. Throws ApiError.
Translation ollama_generate(bool chat, const nlohmann::ordered_json& body,
                            const ServeLimits& limits, const Tokenizer& tok);

}  // namespace deltafin::server
