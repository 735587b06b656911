// Response building (see response.h). Chunks and final objects follow the field order of
// OpenAI's own responses, since some clients and tests compare text.
#include "server/response.h"

#include <random>

namespace deltafin::server {

using json = nlohmann::ordered_json;

std::string finish_reason(StopReason stop, bool tool_calls) {
  switch (stop) {
    case StopReason::kLength:
    case StopReason::kContext:
      return "length";
    default:
      return tool_calls ? "tool_calls" : "stop";
  }
}

json usage_json(const Usage& u) {
  json j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

namespace {
void add_warning(json& j, const Usage& u) {
  if (u.constraint_unfinished)
    j["warning"] =
        "the token limit was reached before the output completed the requested grammar or schema "
        "(finish_reason \"length\"): it does not parse; raise max_tokens";
}
}  // namespace

json timings_json(const Usage& u) {
  const Timings& t = u.timings;
  auto ms = [](double from, double to) { return from > 0 && to >= from ? (to - from) * 1e3 : 0.0; };
  const double end = t.finished > 0 ? t.finished : t.first_token;
  const double predicted_ms = ms(t.first_token, end);
  // The first token comes out of the prefill pass; the decode produced the others.
  const int64_t decoded = std::max<int64_t>(0, u.completion_tokens - 1);
  json j;
  j["prompt_n"] = u.prompt_tokens - u.cached_tokens;
  j["prompt_ms"] = ms(t.admitted, t.first_token > 0 ? t.first_token : end);
  j["predicted_n"] = u.completion_tokens;
  j["predicted_ms"] = predicted_ms;
  j["predicted_per_second"] =
      predicted_ms > 0 ? static_cast<double>(decoded) / (predicted_ms / 1e3) : 0.0;
  j["ttft_ms"] = ms(t.arrived, t.first_token);
  if (t.drafting) {
    j["draft_n"] = t.draft_n;
    j["draft_n_accepted"] = t.draft_n_accepted;
    j["target_passes"] = t.target_passes;
    j["tokens_per_pass"] = t.target_passes > 0 ? static_cast<double>(t.decode_tokens) /
                                                     static_cast<double>(t.target_passes)
                                               : 0.0;
  }
  return j;
}

std::string random_id(const std::string& prefix, size_t chars) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(alphabet) - 2);
  std::string s = prefix;
  for (size_t i = 0; i < chars; ++i) s += alphabet[pick(rng)];
  return s;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

ResponseBuilder::ResponseBuilder(const Tokenizer& tok, Endpoint endpoint, std::string id,
                                 int64_t created, std::string model, bool logprobs,
                                 bool include_usage)
    : tok_(tok),
      endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      logprobs_(logprobs),
      include_usage_(include_usage) {}

json ResponseBuilder::head(const char* chat_object) const {
  json j;
  j["id"] = id_;
  j["object"] = endpoint_ == Endpoint::chat ? chat_object : "text_completion";
  j["created"] = created_;
  j["model"] = model_;
  j["system_fingerprint"] = "deltafin-" DELTAFIN_VERSION;
  return j;
}

json ResponseBuilder::chunk(json choice) const {
  json j = head("chat.completion.chunk");
  j["choices"] = json::array({std::move(choice)});
  if (include_usage_) j["usage"] = nullptr;
  return j;
}

json ResponseBuilder::token_logprob(const GeneratedToken& t) const {
  auto entry = [&](int32_t id, float lp) {
    const std::string_view b = tok_.token_bytes(id);
    json e;
    e["token"] = std::string(b);
    e["logprob"] = lp;
    json bytes = json::array();
    for (const char c : b) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    e["bytes"] = bytes;
    return e;
  };
  json e = entry(t.id, t.chosen.logprob);
  json top = json::array();
  for (const auto& alt : t.top) top.push_back(entry(alt.id, alt.logprob));
  e["top_logprobs"] = top;
  return e;
}

json ResponseBuilder::chat_logprobs(size_t from) const {
  json content = json::array();
  for (size_t i = from; i < tokens_.size(); ++i) content.push_back(token_logprob(tokens_[i]));
  return {{"content", content}, {"refusal", nullptr}};
}

json ResponseBuilder::completion_logprobs(size_t from, size_t to) const {
  json tokens = json::array(), lps = json::array(), top = json::array(), offsets = json::array();
  for (size_t i = from; i < to; ++i) {
    const auto& t = tokens_[i];
    tokens.push_back(std::string(tok_.token_bytes(t.id)));
    lps.push_back(t.chosen.logprob);
    json alts = json::object();
    for (const auto& a : t.top) alts[std::string(tok_.token_bytes(a.id))] = a.logprob;
    top.push_back(alts);
    offsets.push_back(text_offsets_[i]);
  }
  json j;
  j["tokens"] = tokens;
  j["token_logprobs"] = lps;
  j["top_logprobs"] = top;
  j["text_offset"] = offsets;
  return j;
}

std::vector<json> ResponseBuilder::begin() {
  if (endpoint_ != Endpoint::chat) return {};
  json choice;
  choice["index"] = 0;
  choice["delta"] = {{"role", "assistant"}, {"content", ""}};
  choice["logprobs"] = nullptr;  // OpenAI always sends the key
  choice["finish_reason"] = nullptr;
  return {chunk(choice)};
}

std::vector<json> ResponseBuilder::add(const StepUpdate& u) {
  std::vector<json> out;
  const size_t first_token = tokens_.size();
  for (const auto& t : u.tokens) {
    tokens_.push_back(t);
    text_offsets_.push_back(text_bytes_);
    text_bytes_ += tok_.token_bytes(t.id).size();
  }
  if (endpoint_ == Endpoint::completions) {
    std::string text;
    for (const auto& e : u.events) {
      if (e.kind == ParserEvent::Kind::content) text += e.text;
    }
    content_ += text;
    if (text.empty() && !(logprobs_ && tokens_.size() > first_token)) return out;
    json choice;
    choice["text"] = text;
    choice["index"] = 0;
    choice["logprobs"] =
        logprobs_ ? completion_logprobs(first_token, tokens_.size()) : json(nullptr);
    choice["finish_reason"] = nullptr;
    out.push_back(chunk(choice));
    return out;
  }
  // Chat: a chunk per part a step adds to (a text or thinking part's deltas of one step merged),
  // and per tool-call event.
  class Deltas final : public PartFold::Sink {
   public:
    Deltas(ResponseBuilder& b, std::vector<json>& out) : b_(b), out_(out) {}
    void opened(PartFold::Part& p) override {
      if (p.kind != PartFold::Kind::tool) return;
      flush();
      Call c{random_id("call_"), p.name, ""};
      b_.calls_.push_back(c);
      json call;
      call["index"] = static_cast<int>(b_.calls_.size() - 1);
      call["id"] = c.id;
      call["type"] = "function";
      call["function"] = {{"name", c.name}, {"arguments", ""}};
      chunk({{"tool_calls", json::array({call})}});
    }
    void appended(const PartFold::Part& p, const std::string& delta) override {
      if (p.kind == PartFold::Kind::tool) {
        flush();
        b_.calls_.back().arguments += delta;
        json call;
        call["index"] = static_cast<int>(b_.calls_.size() - 1);
        call["function"] = {{"arguments", delta}};
        chunk({{"tool_calls", json::array({call})}});
        return;
      }
      const bool text = p.kind == PartFold::Kind::text;
      (text ? b_.content_ : b_.reasoning_) += delta;
      const char* key = text ? "content" : "reasoning_content";
      if (key_ != key) flush();
      key_ = key;
      pending_ += delta;
    }
    void closed(const PartFold::Part& p) override {
      // A call's arguments are complete; the deltas already carried them. Keep the parser's
      // final text (identical unless a malformed call was cut short).
      if (p.kind == PartFold::Kind::tool) b_.calls_.back().arguments = p.text;
    }
    void flush() {
      if (key_ != nullptr && !pending_.empty()) chunk({{key_, pending_}});
      pending_.clear();
      key_ = nullptr;
    }

   private:
    void chunk(json delta) {
      json choice;
      choice["index"] = 0;
      choice["delta"] = std::move(delta);
      choice["logprobs"] = nullptr;  // OpenAI always sends the key
      choice["finish_reason"] = nullptr;
      out_.push_back(b_.chunk(choice));
    }
    ResponseBuilder& b_;
    std::vector<json>& out_;
    std::string pending_;
    const char* key_ = nullptr;
  } deltas(*this, out);
  fold_.add(u.events, deltas);
  deltas.flush();
  if (logprobs_ && tokens_.size() > first_token) {
    // Logprobs travel with their own chunk: K3's parser holds text back across tokens, so a
    // token and the text it completes need not arrive in the same step.
    json choice;
    choice["index"] = 0;
    choice["delta"] = json::object();
    choice["logprobs"] = chat_logprobs(first_token);
    choice["finish_reason"] = nullptr;
    out.push_back(chunk(choice));
  }
  return out;
}

std::vector<json> ResponseBuilder::end(StopReason stop, const Usage& usage) {
  std::vector<json> out;
  json choice;
  choice["index"] = 0;
  if (endpoint_ == Endpoint::chat) {
    choice["delta"] = json::object();
    choice["logprobs"] = nullptr;  // OpenAI always sends the key
  } else {
    choice["text"] = "";
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason(stop, !calls_.empty());
  out.push_back(chunk(choice));
  add_warning(out.back(), usage);
  if (include_usage_) {
    json u = chunk(json::object());
    u["choices"] = json::array();
    u["usage"] = usage_json(usage);
    u["timings"] = timings_json(usage);
    out.push_back(u);
  }
  return out;
}

json ResponseBuilder::message() const {
  json m;
  m["role"] = "assistant";
  m["content"] = content_.empty() && !calls_.empty() ? json(nullptr) : json(content_);
  if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
  m["refusal"] = nullptr;
  if (!calls_.empty()) {
    json calls = json::array();
    for (const auto& c : calls_) {
      json call;
      call["id"] = c.id;
      call["type"] = "function";
      call["function"] = {{"name", c.name}, {"arguments", c.arguments}};
      calls.push_back(call);
    }
    m["tool_calls"] = calls;
  }
  return m;
}

json ResponseBuilder::response(StopReason stop, const Usage& usage) const {
  json j = head("chat.completion");
  json choice;
  choice["index"] = 0;
  if (endpoint_ == Endpoint::chat) {
    choice["message"] = message();
    choice["logprobs"] = logprobs_ ? chat_logprobs(0) : json(nullptr);
  } else {
    choice["text"] = content_;
    choice["logprobs"] = logprobs_ ? completion_logprobs(0, tokens_.size()) : json(nullptr);
  }
  choice["finish_reason"] = finish_reason(stop, !calls_.empty());
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  j["timings"] = timings_json(usage);
  add_warning(j, usage);
  return j;
}

}  // namespace deltafin::server
