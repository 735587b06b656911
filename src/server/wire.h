// One generation request as each served API writes it.
//
// Every API the server speaks (OpenAI Chat Completions and Completions, Anthropic Messages,
// OpenAI Responses, Ollama) is translated on the way in into the one ServeRequest the engine runs
// (request.h: the K3 rendering, sampling, limits), and on the way out from the engine's
// StepUpdates into that API's own shapes by a Wire. The HTTP layer drives every Wire the same
// way (http_server.cpp: waiting, streaming, keep-alives, cancellation), so streaming rules,
// timeouts and client-gone handling exist once.
//
// State reuse needs nothing from a Wire: the engine keeps snapshots of the token prefixes it
// ran (src/prefix), so the next turn is matched whatever API a client speaks.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/parts.h"
#include "server/response.h"

namespace deltafin::server {

// How an API shapes its errors: OpenAI's {"error": {message, type, param, code}}, Anthropic's
// {"type": "error", "error": {type, message}}, Ollama's {"error": "message"}.
enum class ErrorStyle { openai, anthropic, ollama };

// The error body in `style`; the status stays the ApiError's.
nlohmann::ordered_json error_json(const ApiError& e, ErrorStyle style);

// How a finished generation ended.
struct Outcome {
  StopReason stop = StopReason::kNone;
  std::string stop_string;  // the stop string that matched (kStopString)
  Usage usage;
};

class Wire {
 public:
  virtual ~Wire() = default;

  // Streamed: the body's media type, the bytes at the start (once the engine admitted the
  // request), for each update, at the end, for a failure after the start, and during long
  // silences (prefill) to keep the connection and the client's read timeout alive.
  virtual const char* stream_type() const { return "text/event-stream"; }
  virtual std::string begin() = 0;
  virtual std::string add(const StepUpdate& u) = 0;
  virtual std::string end(const Outcome& o) = 0;
  virtual std::string failure(const ApiError& e) = 0;
  virtual std::string keep_alive() { return ": keep-alive\n\n"; }

  // Not streamed: the whole response body, after every update was add()ed.
  virtual nlohmann::ordered_json response(const Outcome& o) = 0;
};

// A Wire whose answer is a sequence of parts — thinking, text, tool calls — each opened, added
// to and closed in K3's order (Anthropic's content blocks, Responses' output items), as the one
// fold (parts.h) gives them; a subclass writes each step in its shape.
class PartsWire : public Wire {
 public:
  using Kind = PartFold::Kind;
  using Part = PartFold::Part;

  // `single_tool`: report only the first tool call of a turn (the API asked for one at most).
  PartsWire(bool single_tool);
  std::string add(const StepUpdate& u) final;

 protected:
  virtual std::string opened(Part& p) = 0;  // may set its ids
  virtual std::string appended(const Part& p, const std::string& delta) = 0;
  virtual std::string closed(const Part& p) = 0;
  std::string close();  // closes the open part, if any
  const std::vector<Part>& parts() const { return fold_.parts(); }
  int calls() const { return fold_.calls(); }

 private:
  class Writer;  // the fold's sink: what the subclass writes for each of its steps
  PartFold fold_;
};

// A request translated from an API's body: what the engine runs and how to answer it.
struct Translation {
  ServeRequest request;
  std::unique_ptr<Wire> wire;
};

// OpenAI Chat Completions and Completions: ResponseBuilder's chunks as `data:` frames, ended by
// `data: [DONE]`.
std::unique_ptr<Wire> openai_wire(const Tokenizer& tok, const ServeRequest& r,
                                  const std::string& model);

}  // namespace deltafin::server
