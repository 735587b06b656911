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
#include "prefix/reuse.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::server {

struct StepUpdate {
  std::vector<ParserEvent> events;
  std::vector<GeneratedToken> tokens;
};

// Wall-clock points of one request (now_seconds() clock; 0 = not reached), for the
// llama.cpp-style `timings` object of a response.
struct Timings {
  double arrived = 0;      // the request was accepted by the HTTP thread
  double admitted = 0;     // the engine gave it a slot (prefill starts)
  double first_token = 0;  // the first completion token was sampled
  double finished = 0;     // the generation ended
  // Speculative decoding (serve --draft): drafts verified and accepted, decode passes and the
  // tokens they emitted; reported only when drafting.
  bool drafting = false;
  int64_t draft_n = 0, draft_n_accepted = 0, target_passes = 0, decode_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;  // positions the prompt occupies (cached included)
  int64_t cached_tokens = 0;  // of those, continued from a kept snapshot (never prefilled)
  int64_t completion_tokens = 0;
  Timings timings;
  std::string cached_from;   // "RAM" or "disk" when cached_tokens > 0
  double cached_load_s = 0;  // restoring that snapshot
  // The generation hit max_tokens (or the context) before its grammar or schema was complete:
  // the response says so in `warning`, since the output will not parse.
  bool constraint_unfinished = false;
  // Ended (cancelled, timed out) before its prompt was all prefilled: the prompt positions the
  // state held by then, cached included (the server's log line says so).
  bool stopped_in_prefill = false;
  int64_t prompt_prefilled = 0;
};

// "stop", "length" or "tool_calls".
std::string finish_reason(StopReason stop, bool tool_calls);

// The usage of a generation (none yet: nothing completed) fed `input` ids after `cached` ones the
// state already held (kept, or restored by `reuse` when given): the counts, and `t` completed
// with its end and `draft`'s figures. The server's and the C API's responses both come from here.
Usage generation_usage(const Generation* g, int64_t cached, int64_t input, Timings t,
                       const DraftStats& draft, const SequenceReuse* reuse);

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
