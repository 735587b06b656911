// The OpenAI wire and the error styles (see wire.h).
#include "server/wire.h"

#include <ctime>

namespace deltafin::server {

using json = nlohmann::ordered_json;

namespace {

// Anthropic's error types by status (its documented table); others are api_error.
const char* anthropic_error_type(int status) {
  switch (status) {
    case 400:
    case 405:
    case 408:
    case 414:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return "api_error";
  }
}

class OpenAiWire final : public Wire {
 public:
  OpenAiWire(const Tokenizer& tok, const ServeRequest& r, const std::string& model)
      : b_(tok, r.endpoint, random_id(r.endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-"),
           static_cast<int64_t>(std::time(nullptr)), model, r.logprobs, r.include_usage) {}

  std::string begin() override { return frames(b_.begin()); }
  std::string add(const StepUpdate& u) override { return frames(b_.add(u)); }
  std::string end(const Outcome& o) override { return frames(b_.end(o.stop, o.usage)) + kSseDone; }
  std::string failure(const ApiError& e) override {
    return sse(error_json(e, ErrorStyle::openai)) + kSseDone;
  }
  json response(const Outcome& o) override { return b_.response(o.stop, o.usage); }

 private:
  static std::string frames(const std::vector<json>& chunks) {
    std::string out;
    for (const auto& c : chunks) out += sse(c);
    return out;
  }
  ResponseBuilder b_;
};

}  // namespace

class PartsWire::Writer final : public PartFold::Sink {
 public:
  explicit Writer(PartsWire& w) : w_(w) {}
  void opened(Part& p) override { out += w_.opened(p); }
  void appended(const Part& p, const std::string& delta) override { out += w_.appended(p, delta); }
  void closed(const Part& p) override { out += w_.closed(p); }
  std::string out;

 private:
  PartsWire& w_;
};

PartsWire::PartsWire(bool single_tool) : fold_(single_tool) {}

std::string PartsWire::add(const StepUpdate& u) {
  Writer w(*this);
  fold_.add(u.events, w);
  return w.out;
}

std::string PartsWire::close() {
  Writer w(*this);
  fold_.close(w);
  return w.out;
}

json error_json(const ApiError& e, ErrorStyle style) {
  switch (style) {
    case ErrorStyle::anthropic:
      return {{"type", "error"},
              {"error", {{"type", anthropic_error_type(e.status())}, {"message", e.what()}}}};
    case ErrorStyle::ollama:
      return {{"error", e.what()}};
    case ErrorStyle::openai:
      break;
  }
  return e.to_json();
}

std::unique_ptr<Wire> openai_wire(const Tokenizer& tok, const ServeRequest& r,
                                  const std::string& model) {
  return std::make_unique<OpenAiWire>(tok, r, model);
}

}  // namespace deltafin::server
