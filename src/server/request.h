// Validation of OpenAI request bodies, done completely on the HTTP thread before a request is
// queued, so a malformed request never takes a slot and every refusal names its field.
//
// The rule for fields: what we implement is used; harmless defaults that clients send
// (`n: 1`, `store: false`, zero penalties, `logit_bias: {}`) are accepted; anything that would
// change the output but is not implemented, and anything unknown, is a 400 that names it
// (nothing is silently ignored). The result carries everything the engine needs: the prompt ids
// (chat: the K3 rendering; completions: the ordinary tokens or the given ids), generation
// parameters with the server's limits applied, and the response options.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generate/generation.h"
#include "server/image_parts.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

enum class Endpoint { chat, completions };

// What validation needs to know about the server and the model.
inline SamplingParams openai_sampling_defaults() {
  SamplingParams s;
  s.temperature = 1.0f;
  return s;
}

struct ServeLimits {
  std::string model_id = "kimi-k3";
  std::vector<std::string> aliases;  // "*" accepts any model name
  int64_t context = 0;               // positions a sequence may reach
  int64_t max_tokens = 0;            // ceiling for max_tokens (<= context)
  int64_t vocab = 0;                 // model vocabulary (token-id prompts, logit_bias)
  std::vector<int32_t> stop_ids;     // eos and <|end_of_msg|> (stop_ids_for)
  // Sampling of a request that does not set a field: OpenAI's defaults (temperature 1, top_p 1),
  // replaced by what the model's generation_config.json gives.
  SamplingParams sampling = openai_sampling_defaults();
  int64_t prefill_chunk = 256;
  size_t max_json_depth = 64;
  ImagePolicy images;  // what an image part may be at the edge (image_parts.h)
  // Measures a chat's image parts with the model's vision tower (runtime/images.h
  // image_measurer, docs/VISION.md §11.7); empty: a text-only model, whose image parts are
  // refused (400).
  ImageMeasurer measure_image;
};

struct ServeRequest {
  Endpoint endpoint = Endpoint::chat;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;            // chat: logprobs; completions: logprobs given (>= 0)
  int top_logprobs = 0;             // alternatives per token
  std::optional<ChatRequest> chat;  // chat: the parsed conversation (reused for the kept state)
  std::vector<int32_t> prompt;      // the full prompt ids
  // Chat: where its messages end in `prompt` (the prefix store snapshots there; prefix/reuse.h).
  int64_t system_end = 0, messages_end = 0, last_message = 0;
  // Chat: the prompt's images with their spans in `prompt` (RenderedPrompt::images); the
  // scheduler's sequence encodes them (SequenceSpec::images).
  std::vector<PromptImage> images;
  GenerationParams params;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before sampling
  bool max_tokens_capped = false;                     // the client asked for more than the ceiling
};

// Parses a body (JSON text) with the depth limit; throws ApiError 400 for invalid JSON, a body
// that is not an object, or nesting deeper than `max_depth`.
nlohmann::ordered_json parse_body(const std::string& body, size_t max_depth);

// True when `name` is the served id or one of the aliases (or an alias is "*").
bool model_matches(const ServeLimits& limits, const std::string& name);

// Validates a /v1/chat/completions or /v1/completions body. Throws ApiError.
ServeRequest parse_chat_request(const nlohmann::ordered_json& body, const ServeLimits& limits,
                                const Tokenizer& tok);
ServeRequest parse_completion_request(const nlohmann::ordered_json& body, const ServeLimits& limits,
                                      const Tokenizer& tok);

}  // namespace deltafin::server
