// OpenAI response shapes, built from what a Generation produces.
//
// The engine hands each request a stream of StepUpdates (parser events and the tokens sampled
// in that step, with their logprobs). A ResponseBuilder folds them into the response: for
// streaming it returns the `chat.completion.chunk` / `text_completion` chunks each update
// produces; in every case it accumulates the message so that, at the end, it can give the whole
// `chat.completion` / `text_completion` object. One builder serves both modes, so a streamed and a
// non-streamed answer to the same request carry the same text, tool calls and logprobs.
//
// K3 tool calls (parser tool_call_begin/delta/end) become OpenAI `tool_calls` with an id
// (`call_…`), `type: "function"` and `function.arguments` as a JSON string; streamed, the first
// delta of a call carries index, id, type and name, the following ones argument fragments. The
// builder has no dependency on the engine, so it is unit-tested on K3-formatted token sequences.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "generate/generation.h"
#include "generate/speculative.h"
#include "runtime/sequence.h"
#include "server/parts.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

struct StepUpdate {
  std::vector<ParserEvent> events;
  std::vector<GeneratedToken> tokens;
};

// A request's counts and times are its Sequence's (runtime/sequence.h).
using deltafin::Timings;
using deltafin::Usage;

// "stop", "length" or "tool_calls".
std::string finish_reason(StopReason stop, bool tool_calls);

nlohmann::ordered_json usage_json(const Usage& u);
// {prompt_n, prompt_ms, predicted_n, predicted_ms, predicted_per_second, ttft_ms} (docs/SERVER.md):
// prompt_n counts the prompt tokens run through the model (not the cached ones), prompt_ms the
// prefill up to the first token, predicted_ms the decode after it.
nlohmann::ordered_json timings_json(const Usage& u);

// A random id with a prefix: "chatcmpl-…", "cmpl-…", "call_…".
std::string random_id(const std::string& prefix, size_t chars = 24);

class ResponseBuilder {
 public:
  ResponseBuilder(const Tokenizer& tok, Endpoint endpoint, std::string id, int64_t created,
                  std::string model, bool logprobs, bool include_usage);

  // Streaming: the first chunk (chat: the assistant role with empty content; completions: none).
  std::vector<nlohmann::ordered_json> begin();
  // Folds one update in; returns the chunks it produces (streaming may ignore them).
  std::vector<nlohmann::ordered_json> add(const StepUpdate& u);
  // The final chunk with finish_reason, then (with include_usage) the usage chunk.
  std::vector<nlohmann::ordered_json> end(StopReason stop, const Usage& usage);
  // The whole non-streamed response.
  nlohmann::ordered_json response(StopReason stop, const Usage& usage) const;

  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  struct Call {
    std::string id, name, arguments;
  };
  const std::vector<Call>& tool_calls() const { return calls_; }

 private:
  // id, object ("text_completion", or chat_object for chat), created, model, system_fingerprint.
  nlohmann::ordered_json head(const char* chat_object) const;
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;
  nlohmann::ordered_json token_logprob(const GeneratedToken& t) const;  // chat shape
  nlohmann::ordered_json chat_logprobs(size_t from) const;
  nlohmann::ordered_json completion_logprobs(size_t from, size_t to) const;
  nlohmann::ordered_json message() const;

  const Tokenizer& tok_;
  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool logprobs_, include_usage_;
  std::string content_, reasoning_;
  std::vector<Call> calls_;
  PartFold fold_;
  std::vector<GeneratedToken> tokens_;
  std::vector<size_t> text_offsets_;  // completions: byte offset of each token's text
  size_t text_bytes_ = 0;
};

// SSE framing of one event: "data: <json>\n\n".
std::string sse(const nlohmann::ordered_json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// JSON text for the wire: invalid UTF-8 (a token's partial bytes) becomes U+FFFD.
std::string dump(const nlohmann::ordered_json& j);

}  // namespace deltafin::server
