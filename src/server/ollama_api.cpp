// Ollama <-> the engine's request (see ollama_api.h).
#include "server/ollama_api.h"

#include <chrono>
#include <ctime>

#include "core/json_parse.h"
#include "core/log.h"
#include "server/translate.h"

namespace deltafin::server {

// Named, not anonymous: the sanitizer builds compile src/server as one unity file, where
// another file's helpers of the same names would clash. Inside `translate`, so the shared field
// readers (translate.h) are found without naming each.
namespace translate::ollama {

using json = nlohmann::ordered_json;

// Ollama names a model NAME:TAG; the served name has no tag, so NAME:latest is the same model.
std::string untagged(const std::string& name) {
  const std::string tag = ":latest";
  if (name.size() > tag.size() && name.compare(name.size() - tag.size(), tag.size(), tag) == 0)
    return name.substr(0, name.size() - tag.size());
  return name;
}

void check_model(const json& body, const ServeLimits& limits) {
  const std::string name = untagged(string_of(need(body, "model", ""), "model"));
  if (!model_matches(limits, name)) {
    throw ApiError(
        404,
        fmt::format("model \"{}\" not found; this server serves \"{}\"", name, limits.model_id),
        "invalid_request_error", "model", "model_not_found");
  }
}

// RFC 3339 with nanoseconds, as Ollama writes created_at.
std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch());
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09d}Z", buf, ns.count() % 1000000000);
}

json details() {
  return {{"parent_model", ""},   {"format", "safetensors"},
          {"family", "kimi_k3"},  {"families", json::array({"kimi_k3"})},
          {"parameter_size", ""}, {"quantization_level", "MXFP4"}};
}

json model_entry(const std::string& name, int64_t created) {
  char when[32];
  const std::time_t t = static_cast<std::time_t>(created);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return {{"name", name}, {"model", name}, {"modified_at", when},
          {"size", 0},    {"digest", ""},  {"details", details()}};
}

// Ollama's options -> Chat Completions sampling fields. Hardware and context options are
// accepted and have no effect (the server fixes them at start); options that would change the
// output but are not implemented are refused unless at their neutral value; names Ollama does
// not know are ignored with a log line, as Ollama does.
void convert_options(const json& body, json& chat, const ServeLimits& limits) {
  const json* o = field(body, "options");
  if (o == nullptr) return;
  object_of(*o, "options");
  static const std::pair<const char*, const char*> same[] = {
      {"temperature", "temperature"},
      {"top_p", "top_p"},
      {"top_k", "top_k"},
      {"min_p", "min_p"},
      {"seed", "seed"},
      {"stop", "stop"},
      {"repeat_penalty", "repetition_penalty"},
      {"presence_penalty", "presence_penalty"},
      {"frequency_penalty", "frequency_penalty"}};
  static const char* fixed[] = {"num_ctx",  "num_batch", "num_gpu",   "main_gpu", "num_thread",
                                "use_mmap", "use_mlock", "numa",      "low_vram", "vocab_only",
                                "f16_kv",   "num_keep",  "logits_all"};
  static const std::pair<const char*, double> neutral[] = {
      {"typical_p", 1.0}, {"mirostat", 0.0}, {"tfs_z", 1.0}, {"repeat_last_n", 64.0}};
  for (const auto& [k, v] : o->items()) {
    const std::string p = "options." + k;
    if (v.is_null()) continue;
    bool done = false;
    for (const auto& [from, to] : same) {
      if (k == from) {
        chat[to] = v;
        done = true;
      }
    }
    for (const char* f : fixed) done = done || k == f;
    for (const auto& [name, value] : neutral) {
      if (k != name) continue;
      if (!v.is_number() || v.get<double>() != value)
        bad_request(p, "{}: {} is not supported (only {})", p, v.dump(), value);
      done = true;
    }
    if (k == "mirostat_tau" || k == "mirostat_eta" || k == "penalize_newline") done = true;
    if (k == "num_predict") {
      if (!v.is_number_integer()) bad_request(p, "{}: expected an integer, got {}", p, v.dump());
      // -1: no limit, -2: fill the context (both: up to the server's ceiling).
      const int64_t n = v.get<int64_t>();
      if (n < -2 || n == 0)
        bad_request(p, "{}: expected a positive number of tokens, -1 or -2, got {}", p, n);
      chat["max_tokens"] = n > 0 ? n : limits.max_tokens;
      done = true;
    }
    if (!done) log_info("[serve] Ollama option {} is not known; ignored (as Ollama does)", k);
  }
}

void convert_common(const json& body, json& chat, const ServeLimits& limits) {
  chat["model"] = limits.model_id;
  chat["stream"] = bool_field(body, "stream", "").value_or(true);  // Ollama streams by default
  chat["max_tokens"] = limits.max_tokens;  // Ollama's num_predict default: no limit
  convert_options(body, chat, limits);
  if (const json* k = field(body, "keep_alive"); k != nullptr && !k->is_string() && !k->is_number())
    bad_request("keep_alive", "keep_alive: expected a duration (\"5m\") or seconds, got {}",
                type_name(*k));
  if (const json* t = field(body, "think")) {
    if (t->is_boolean()) {
      chat["thinking"] = *t;
    } else {
      chat["thinking"] = true;
      chat["reasoning_effort"] = k3_effort(string_of(*t, "think"), "think");
    }
  }
  if (const json* f = field(body, "format")) {
    if (f->is_string() && f->get<std::string>() == "json") {
      chat["response_format"] = {{"type", "json_object"}};
    } else if (f->is_object()) {
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "output"}, {"schema", *f}}}};
    } else if (!(f->is_string() && f->get<std::string>().empty())) {
      bad_request("format", "format: expected \"json\" or a JSON schema object, got {}", f->dump());
    }
  }
}

// `images` (base64 strings, no MIME type: the bytes say which) and the text -> the message's
// content: the text alone when there are none, else the image_url parts then the text (the
// order Ollama's own prompt templates use).
json with_images(const json& obj, const json& text, const std::string& path, ImageGate& gate) {
  const json* im = field(obj, "images");
  if (im == nullptr || (im->is_array() && im->empty())) return text;
  const std::string ip = path.empty() ? std::string("images") : path + ".images";
  array_of(*im, ip);
  json parts = json::array();
  for (size_t k = 0; k < im->size(); ++k) {
    const std::string p = fmt::format("{}[{}]", ip, k);
    parts.push_back(ImageGate::part(gate.from_base64("", string_of((*im)[k], p), p, p), p));
  }
  const std::string t = string_of(text, path.empty() ? "prompt" : path + ".content");
  if (!t.empty()) parts.push_back({{"type", "text"}, {"text", t}});
  return parts;
}

json chat_messages(const json& body, ImageGate& gate) {
  const json& msgs = array_of(need(body, "messages", ""), "messages");
  if (msgs.size() > kMaxMessages)
    bad_request("messages", "messages: at most {} messages, got {}", kMaxMessages, msgs.size());
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    const json& m = object_of(msgs[i], p);
    only_fields(m, {"role", "content", "thinking", "tool_calls", "tool_name", "images", "name"}, p);
    const std::string role = string_of(need(m, "role", p), p + ".role");
    json c = {{"role", role}, {"content", field(m, "content") ? m["content"] : json("")}};
    if (const json* im = field(m, "images"); im != nullptr && !(im->is_array() && im->empty())) {
      if (role != "user") {
        bad_request(p + ".images", "{}.images: images are accepted on user messages only (got {})",
                    p, role);
      }
      c["content"] = with_images(m, c["content"], p, gate);
    }
    if (const json* t = field(m, "thinking"))
      c["reasoning_content"] = string_of(*t, p + ".thinking");
    if (const json* n = field(m, "tool_name")) c["name"] = string_of(*n, p + ".tool_name");
    if (const json* n = field(m, "name"); n != nullptr && !c.contains("name")) c["name"] = *n;
    if (const json* calls = field(m, "tool_calls")) {
      json out_calls = json::array();
      array_of(*calls, p + ".tool_calls");
      for (size_t k = 0; k < calls->size(); ++k) {
        const std::string cp = fmt::format("{}.tool_calls[{}]", p, k);
        const json& call = object_of((*calls)[k], cp);
        only_fields(call, {"id", "type", "function"}, cp);
        const json& fn = object_of(need(call, "function", cp), cp + ".function");
        only_fields(fn, {"name", "arguments", "index"}, cp + ".function");
        const json* args = field(fn, "arguments");
        json oc = {{"type", "function"},
                   {"function",
                    {{"name", string_of(need(fn, "name", cp + ".function"), cp + ".function.name")},
                     {"arguments", args == nullptr ? "{}"
                                   : args->is_string()
                                       ? args->get<std::string>()
                                       : object_of(*args, cp + ".function.arguments").dump()}}}};
        if (const json* id = field(call, "id")) oc["id"] = *id;
        out_calls.push_back(oc);
      }
      c["tool_calls"] = out_calls;
    }
    out.push_back(c);
  }
  return out;
}

// NDJSON lines in /api/chat's or /api/generate's shape.
class OllamaWire final : public Wire {
 public:
  OllamaWire(bool chat, std::string model) : chat_(chat), model_(std::move(model)) {}

  const char* stream_type() const override { return "application/x-ndjson"; }
  std::string begin() override { return ""; }
  std::string keep_alive() override { return ""; }

  // A step's text and thinking go out in one line, a tool call in a line of its own once it is
  // complete (Ollama streams no partial arguments).
  std::string add(const StepUpdate& u) override {
    Lines lines(*this);
    fold_.add(u.events, lines);
    lines.flush();
    return lines.out;
  }

  std::string end(const Outcome& o) override {
    json j = head();
    j.update(fields("", "", json::array()));
    j.update(final_fields(o));
    return line(j);
  }

  std::string failure(const ApiError& e) override {
    return line(error_json(e, ErrorStyle::ollama));
  }

  json response(const Outcome& o) override {
    json j = head();
    j.update(fields(content_, thinking_, calls_));
    j.update(final_fields(o));
    return j;
  }

 private:
  static std::string line(const json& j) { return dump(j) + "\n"; }

  json head() const { return {{"model", model_}, {"created_at", timestamp()}}; }

  json fields(const std::string& content, const std::string& thinking, const json& calls) const {
    if (!chat_) {
      json j = {{"response", content}};
      if (!thinking.empty()) j["thinking"] = thinking;
      return j;
    }
    json m = {{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) m["thinking"] = thinking;
    if (!calls.empty()) m["tool_calls"] = calls;
    return {{"message", m}};
  }

  static json tool_call(const PartFold::Part& p, int index) {
    return {{"id", random_id("call_")},
            {"function",
             {{"index", index}, {"name", p.name}, {"arguments", arguments_object(p.text)}}}};
  }

  static json final_fields(const Outcome& o) {
    const Timings& t = o.usage.timings;
    auto ns = [](double from, double to) {
      return from > 0 && to >= from ? static_cast<int64_t>((to - from) * 1e9) : int64_t{0};
    };
    const double first = t.first_token > 0 ? t.first_token : t.finished;
    json j;
    j["done"] = true;
    j["done_reason"] =
        o.stop == StopReason::kLength || o.stop == StopReason::kContext ? "length" : "stop";
    j["total_duration"] = ns(t.arrived, t.finished);
    j["load_duration"] = 0;
    j["prompt_eval_count"] = o.usage.prompt_tokens - o.usage.cached_tokens;
    j["prompt_eval_duration"] = ns(t.admitted, first);
    j["eval_count"] = o.usage.completion_tokens;
    j["eval_duration"] = ns(first, t.finished);
    return j;
  }

  // The fold's sink for one step.
  class Lines final : public PartFold::Sink {
   public:
    explicit Lines(OllamaWire& w) : w_(w) {}
    void opened(PartFold::Part&) override {}
    void appended(const PartFold::Part& p, const std::string& delta) override {
      if (p.kind == PartFold::Kind::text) {
        content += delta;
        w_.content_ += delta;
      } else if (p.kind == PartFold::Kind::thinking) {
        thinking += delta;
        w_.thinking_ += delta;
      }
    }
    void closed(const PartFold::Part& p) override {
      if (p.kind != PartFold::Kind::tool) return;
      flush();
      const json call = tool_call(p, static_cast<int>(w_.calls_.size()));
      w_.calls_.push_back(call);
      json j = w_.head();
      j.update(w_.fields("", "", json::array({call})));
      j["done"] = false;
      out += line(j);
    }
    void flush() {
      if (content.empty() && thinking.empty()) return;
      json j = w_.head();
      j.update(w_.fields(content, thinking, json::array()));
      j["done"] = false;
      out += line(j);
      content.clear();
      thinking.clear();
    }
    std::string content, thinking, out;

   private:
    OllamaWire& w_;
  };

  bool chat_;
  std::string model_;
  PartFold fold_;
  std::string content_, thinking_;
  json calls_ = json::array();
};

json ollama_info_impl(const std::string& route, const std::string& body, const ServeLimits& served,
                      int64_t created) {
  if (route == "/api/version") return {{"version", DELTAFIN_VERSION}};
  if (route == "/api/tags" || route == "/api/ps") {
    json models = json::array();
    std::vector<std::string> names = {served.model_id};
    for (const auto& a : served.aliases) {
      if (a != "*" && a != served.model_id) names.push_back(a);
    }
    for (const auto& n : names) {
      json m = model_entry(n, created);
      if (route == "/api/ps") {
        m.erase("modified_at");
        m["expires_at"] = "2318-01-01T00:00:00Z";  // loaded for the server's life
        m["size_vram"] = 0;
        m["context_length"] = served.context;
      }
      models.push_back(m);
    }
    return {{"models", models}};
  }
  const json b = parse_body(body, served.max_json_depth);
  if (route == "/api/show") {
    only_fields(b, {"model", "name", "verbose"}, "");
    json named = b;
    if (!named.contains("model") && named.contains("name")) named["model"] = named["name"];
    check_model(named, served);
    json info = {{"general.architecture", "kimi_k3"}};
    if (served.context > 0) info["kimi_k3.context_length"] = served.context;
    return {{"modelfile", ""},
            {"parameters", ""},
            {"template", ""},
            {"details", details()},
            {"model_info", info},
            {"capabilities", json::array({"completion", "tools", "thinking"})},
            {"modified_at", model_entry(served.model_id, created)["modified_at"]}};
  }
  // /api/embed, /api/embeddings
  throw ApiError(400,
                 fmt::format("\"{}\" does not support embeddings: Kimi K3 is a text generation "
                             "model with no embedding output",
                             served.model_id),
                 "invalid_request_error", std::nullopt, "embeddings_not_supported");
}

std::optional<json> ollama_load_only_impl(bool chat, const json& body, const ServeLimits& limits) {
  const json* what = field(body, chat ? "messages" : "prompt");
  const bool empty = what == nullptr || (what->is_array() && what->empty()) ||
                     (what->is_string() && what->get<std::string>().empty());
  if (!empty) return std::nullopt;
  check_model(body, limits);
  json j = {{"model", limits.model_id}, {"created_at", timestamp()}};
  if (chat) {
    j["message"] = {{"role", "assistant"}, {"content", ""}};
  } else {
    j["response"] = "";
  }
  j["done"] = true;
  j["done_reason"] = "load";
  return j;
}

Translation ollama_generate_impl(bool chat, const json& body, const ServeLimits& limits,
                                 const Tokenizer& tok) {
  json c;
  if (chat) {
    only_fields(
        body, {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"},
        "");
    check_model(body, limits);
    convert_common(body, c, limits);
    ImageGate gate(limits.images);
    c["messages"] = chat_messages(body, gate);
    if (c["messages"].empty())
      bad_request("messages", "messages: at least one message is required");
    if (const json* t = field(body, "tools"); t != nullptr && !t->empty()) c["tools"] = *t;
  } else {
    only_fields(body,
                {"model", "prompt", "suffix", "system", "template", "context", "stream", "raw",
                 "format", "options", "keep_alive", "think", "images"},
                "");
    check_model(body, limits);
    for (const char* k : {"suffix", "template", "context"}) {
      const json* v = field(body, k);
      if (v != nullptr && !(v->is_string() && v->get<std::string>().empty()) &&
          !(v->is_array() && v->empty()))
        bad_request(k, "{} is not supported by this server (K3's own chat template is used)", k);
    }
    convert_common(body, c, limits);
    const std::string prompt = string_of(need(body, "prompt", ""), "prompt");
    if (bool_field(body, "raw", "").value_or(false)) {
      if (const json* im = field(body, "images"); im != nullptr && !(im->is_array() && im->empty()))
        bad_request("images",
                    "images: not available with raw: true (no chat template to place "
                    "them in)");
      // The prompt text as it is: a plain completion.
      json completion = {{"model", c["model"]},
                         {"prompt", prompt},
                         {"stream", c["stream"]},
                         {"max_tokens", c["max_tokens"]}};
      for (const char* k : {"temperature", "top_p", "top_k", "min_p", "seed", "stop",
                            "repetition_penalty", "presence_penalty", "frequency_penalty"}) {
        if (c.contains(k)) completion[k] = c[k];
      }
      for (const char* k : {"thinking", "response_format"}) {
        if (c.contains(k))
          bad_request(k == std::string("thinking") ? "think" : "format",
                      "{}: not available with raw: true (no chat template)",
                      k == std::string("thinking") ? "think" : "format");
      }
      ServeRequest r = parse_completion_request(completion, limits, tok);
      return {std::move(r), std::make_unique<OllamaWire>(false, limits.model_id)};
    }
    json messages = json::array();
    if (const json* s = field(body, "system"))
      messages.push_back({{"role", "system"}, {"content", string_of(*s, "system")}});
    ImageGate gate(limits.images);
    messages.push_back({{"role", "user"}, {"content", with_images(body, json(prompt), "", gate)}});
    c["messages"] = messages;
  }
  ServeRequest r = to_engine(c, limits, tok);
  return {std::move(r), std::make_unique<OllamaWire>(chat, limits.model_id)};
}

}  // namespace translate::ollama

using json = nlohmann::ordered_json;

json ollama_info(const std::string& route, const std::string& body, const ServeLimits& served,
                 int64_t created) {
  return translate::ollama::ollama_info_impl(route, body, served, created);
}

std::optional<json> ollama_load_only(bool chat, const json& body, const ServeLimits& limits) {
  return translate::ollama::ollama_load_only_impl(chat, body, limits);
}

Translation ollama_generate(bool chat, const json& body, const ServeLimits& limits,
                            const Tokenizer& tok) {
  return translate::ollama::ollama_generate_impl(chat, body, limits, tok);
}

}  // namespace deltafin::server
