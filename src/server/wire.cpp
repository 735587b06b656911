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

PartsWire::PartsWire(bool single_tool) : single_tool_(single_tool) {}

std::string PartsWire::add(const StepUpdate& u) {
  std::string out;
  for (const auto& e : u.events) {
    switch (e.kind) {
      case ParserEvent::Kind::reasoning:
      case ParserEvent::Kind::content:
        if (e.text.empty()) break;
        out += open(e.kind == ParserEvent::Kind::reasoning ? Kind::thinking : Kind::text);
        parts_.back().text += e.text;
        out += appended(parts_.back(), e.text);
        break;
      case ParserEvent::Kind::tool_call_begin:
        dropping_ = single_tool_ && calls_ > 0;
        if (dropping_) break;
        ++calls_;
        out += open(Kind::tool, e.name);
        break;
      case ParserEvent::Kind::tool_call_delta:
        if (dropping_ || open_ != Kind::tool || e.text.empty()) break;
        parts_.back().text += e.text;
        out += appended(parts_.back(), e.text);
        break;
      case ParserEvent::Kind::tool_call_end:
        if (dropping_ || open_ != Kind::tool) break;
        parts_.back().text = e.text;  // the parser's final text (a malformed call's, cut short)
        out += close();
        break;
      case ParserEvent::Kind::end_of_turn:
        break;
    }
  }
  return out;
}

std::string PartsWire::open(Kind kind, const std::string& name) {
  if (open_ == kind && kind != Kind::tool) return "";
  std::string out = close();
  parts_.push_back({kind, "", name, "", ""});
  open_ = kind;
  return out + opened(parts_.back());
}

std::string PartsWire::close() {
  if (open_ == Kind::none) return "";
  open_ = Kind::none;
  return closed(parts_.back());
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
