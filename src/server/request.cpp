// Request validation (see request.h). Each field is read by one small helper that names the
// field and the expected type in its error, so the checks below read as a table of the OpenAI
// fields and what this server does with each.
#include "server/request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/json_parse.h"
#include "server/api_error.h"
#include "server/structured.h"
#include "tokenizer/chat_check.h"

namespace deltafin::server {

namespace {

using json = nlohmann::ordered_json;

const char* type_name(const json& v) {
  return json_type_name(v.type());
}

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const json& body, const char* key, double lo, double hi) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) bad_request(key, "{}: expected a number, got {}", key, type_name(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_request(key, "{}: {} is out of range (expected {} to {})", key, v->dump(), lo, hi);
  return d;
}

std::optional<int64_t> get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  int64_t out = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad_request(key, "{}: {} is out of range (expected {} to {})", key, v->dump(), lo, hi);
    }
    out = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    out = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // 5.0 is an integer to most JSON producers (JavaScript has one number type).
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
      bad_request(key, "{}: expected an integer, got {}", key, v->dump());
    }
    out = static_cast<int64_t>(d);
  } else {
    bad_request(key, "{}: expected an integer, got {}", key, type_name(*v));
  }
  if (out < lo || out > hi)
    bad_request(key, "{}: {} is out of range (expected {} to {})", key, out, lo, hi);
  return out;
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) bad_request(key, "{}: expected true or false, got {}", key, type_name(*v));
  return v->get<bool>();
}

// Fields every client may send, by endpoint; everything else is refused by name.
const std::set<std::string>& common_fields() {
  static const std::set<std::string> s = {"model",
                                          "max_tokens",
                                          "temperature",
                                          "top_p",
                                          "top_k",
                                          "min_p",
                                          "seed",
                                          "stop",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "repetition_penalty",
                                          "n",
                                          "stream",
                                          "stream_options",
                                          "logprobs",
                                          "user",
                                          "metadata",
                                          "logit_bias",
                                          "store",
                                          "service_tier",
                                          "grammar",
                                          "json_schema"};
  return s;
}
const std::set<std::string>& chat_fields() {
  static const std::set<std::string> s = {"messages",
                                          "max_completion_tokens",
                                          "top_logprobs",
                                          "tools",
                                          "tool_choice",
                                          "parallel_tool_calls",
                                          "reasoning_effort",
                                          "thinking",
                                          "chat_template_kwargs",
                                          "response_format",
                                          "modalities",
                                          "audio",
                                          "prediction",
                                          "functions",
                                          "function_call"};
  return s;
}
const std::set<std::string>& completion_fields() {
  static const std::set<std::string> s = {"prompt", "echo", "suffix", "best_of"};
  return s;
}

void check_known_fields(const json& body, Endpoint ep) {
  const auto& extra = ep == Endpoint::chat ? chat_fields() : completion_fields();
  for (const auto& [k, v] : body.items()) {
    if (common_fields().count(k) != 0 || extra.count(k) != 0) continue;
    if (ep == Endpoint::completions && chat_fields().count(k) != 0) {
      bad_request(k, "{} is a chat field; /v1/completions does not take it", k);
    }
    if (ep == Endpoint::chat && completion_fields().count(k) != 0) {
      bad_request(k, "{} is a /v1/completions field; chat requests do not take it", k);
    }
    bad_request(k, "{} is not supported by this server (refusing to silently ignore it)", k);
  }
}

// A field that must be absent, null or one accepted value.
void require_default(const json& body, const char* key, const json& accepted, const char* why) {
  const json* v = field(body, key);
  if (v == nullptr || *v == accepted) return;
  bad_request(key, "{}: {} is not supported ({}); accepted: {}", key, v->dump(), why,
              accepted.dump());
}

void check_model(const json& body, const ServeLimits& limits) {
  const json* v = field(body, "model");
  if (v == nullptr) return;  // the served model
  if (!v->is_string()) bad_request("model", "model: expected a string, got {}", type_name(*v));
  const std::string name = v->get<std::string>();
  if (!model_matches(limits, name)) {
    throw ApiError(404,
                   fmt::format("The model `{}` does not exist; this server serves `{}`", name,
                               limits.model_id),
                   "invalid_request_error", "model", "model_not_found");
  }
}

std::vector<std::string> parse_stop(const json& body) {
  const json* v = field(body, "stop");
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 16) bad_request("stop", "stop: at most 16 stop sequences, got {}", v->size());
    for (const auto& s : *v) {
      if (!s.is_string()) bad_request("stop", "stop: expected strings, got {}", type_name(s));
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_request("stop", "stop: expected a string or an array of strings, got {}", type_name(*v));
  }
  for (const auto& s : out) {
    if (s.empty()) bad_request("stop", "stop: stop sequences must not be empty");
  }
  return out;
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& body,
                                                        const ServeLimits& limits) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(body, "logit_bias");
  if (v == nullptr) return out;
  if (!v->is_object())
    bad_request("logit_bias", "logit_bias: expected an object of token id -> bias, got {}",
                type_name(*v));
  if (v->size() > 1024)
    bad_request("logit_bias", "logit_bias: at most 1024 entries, got {}", v->size());
  for (const auto& [k, b] : v->items()) {
    int64_t id = -1;
    bool ok = !k.empty() && k.size() <= 10 &&
              std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (ok) id = std::stoll(k);
    if (!ok || id >= limits.vocab) {
      bad_request("logit_bias", "logit_bias: key \"{}\" is not a token id (expected 0 to {})", k,
                  limits.vocab - 1);
    }
    if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() < -100 ||
        b.get<double>() > 100) {
      bad_request("logit_bias", "logit_bias[\"{}\"]: expected a number from -100 to 100, got {}", k,
                  b.dump());
    }
    out.emplace_back(static_cast<int32_t>(id), b.get<float>());
  }
  return out;
}

// The options both endpoints share: sampling, stop, stream, n, defaults clients send.
void parse_common(const json& body, const ServeLimits& limits, ServeRequest& r,
                  int64_t default_max_tokens) {
  check_model(body, limits);
  auto& s = r.params.sampling;
  const SamplingParams& d = limits.sampling;  // the defaults (generation_config.json's)
  s.temperature = static_cast<float>(get_number(body, "temperature", 0, 2).value_or(d.temperature));
  s.top_p = static_cast<float>(get_number(body, "top_p", 0, 1).value_or(d.top_p));
  if (field(body, "top_p") != nullptr && s.top_p <= 0)
    bad_request("top_p", "top_p: must be greater than 0");
  const int64_t top_k =
      get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max()).value_or(d.top_k);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // -1 is "off" in vLLM's convention
  s.min_p = static_cast<float>(get_number(body, "min_p", 0, 1).value_or(d.min_p));
  s.presence_penalty =
      static_cast<float>(get_number(body, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty =
      static_cast<float>(get_number(body, "frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = static_cast<float>(
      get_number(body, "repetition_penalty", 0.01, 100).value_or(d.repetition_penalty));
  if (auto seed = get_int(body, "seed", std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*seed);
    s.has_seed = true;
  }
  try {
    s.validate();
  } catch (const InvalidArgument& e) {
    bad_request("", "{}", e.what());
  }
  if (auto n = get_int(body, "n", 1, std::numeric_limits<int32_t>::max()); n && *n != 1) {
    bad_request("n", "n: only n = 1 is supported (one choice per request), got {}", *n);
  }
  r.params.stop_strings = parse_stop(body);
  r.params.stop_ids = limits.stop_ids;
  r.logit_bias = parse_logit_bias(body, limits);

  r.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object())
      bad_request("stream_options", "stream_options: expected an object, got {}", type_name(*so));
    if (!r.stream)
      bad_request("stream_options", "stream_options: only allowed when stream is true");
    for (const auto& [k, v] : so->items()) {
      if (k != "include_usage")
        bad_request("stream_options", "stream_options.{} is not supported (only include_usage)", k);
    }
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  if (const json* u = field(body, "user"); u != nullptr && !u->is_string()) {
    bad_request("user", "user: expected a string, got {}", type_name(*u));
  }
  if (const json* m = field(body, "metadata"); m != nullptr && !m->is_object()) {
    bad_request("metadata", "metadata: expected an object, got {}", type_name(*m));
  }
  require_default(body, "store", false, "this server keeps no completions");
  if (const json* t = field(body, "service_tier");
      t != nullptr && *t != "auto" && *t != "default") {
    bad_request("service_tier",
                "service_tier: {} is not supported (accepted: \"auto\", \"default\")", t->dump());
  }

  // max_tokens: capped by the ceiling; the context limit stops generation as well.
  std::optional<int64_t> mt = get_int(body, "max_tokens", 1, std::numeric_limits<int64_t>::max());
  if (r.endpoint == Endpoint::chat) {
    auto mct = get_int(body, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max());
    if (mt && mct && *mt != *mct) {
      bad_request("max_completion_tokens",
                  "max_tokens ({}) and max_completion_tokens ({}) disagree; give one", *mt, *mct);
    }
    if (mct) mt = mct;
  }
  int64_t max_new = mt.value_or(default_max_tokens);
  if (max_new > limits.max_tokens) {
    max_new = limits.max_tokens;
    r.max_tokens_capped = mt.has_value();
  }
  r.params.max_new_tokens = max_new;
  r.params.context_limit = limits.context;
  r.params.prefill_chunk = limits.prefill_chunk;
}

void check_context(const ServeRequest& r, const ServeLimits& limits, const char* param) {
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n + 1 > limits.context) {
    throw ApiError(
        400,
        fmt::format(
            "This model's context is {} tokens, but the prompt has {} tokens (it must leave room "
            "for at least one generated token)",
            limits.context, n),
        "invalid_request_error", param, "context_length_exceeded");
  }
}

// "messages[2].content: ..." -> "messages[2].content" (the renderer's errors start with a path).
std::string param_of(const std::string& msg) {
  const size_t colon = msg.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string head = msg.substr(0, colon);
  if (head.find(' ') != std::string::npos) return "";
  return head;
}

}  // namespace

json parse_body(const std::string& body, size_t max_depth) {
  // The shared entry point checks the nesting depth on the raw text before the parser recurses.
  json j;
  try {
    j = parse_ordered_json(body, "the body", max_depth);
  } catch (const InvalidArgument& e) {
    bad_request("", "{}", e.what());
  }
  if (!j.is_object()) bad_request("", "the body must be a JSON object, got {}", type_name(j));
  return j;
}

bool model_matches(const ServeLimits& limits, const std::string& name) {
  if (name == limits.model_id) return true;
  for (const auto& a : limits.aliases) {
    if (a == "*" || a == name) return true;
  }
  return false;
}

ServeRequest parse_chat_request(const json& body, const ServeLimits& limits, const Tokenizer& tok) {
  ServeRequest r;
  r.endpoint = Endpoint::chat;
  check_known_fields(body, Endpoint::chat);
  parse_common(body, limits, r, limits.max_tokens);

  if (auto lp = get_bool(body, "logprobs")) r.logprobs = *lp;
  if (auto tl = get_int(body, "top_logprobs", 0, 20)) {
    if (!r.logprobs) bad_request("top_logprobs", "top_logprobs: requires logprobs to be true");
    r.top_logprobs = static_cast<int>(*tl);
  }
  r.params.top_logprobs = r.logprobs ? r.top_logprobs : -1;

  require_default(body, "modalities", json::array({"text"}), "text output only");
  require_default(body, "audio", nullptr, "text output only");
  require_default(body, "prediction", nullptr, "predicted outputs are not implemented");
  if (field(body, "functions") != nullptr || field(body, "function_call") != nullptr) {
    bad_request(
        field(body, "functions") ? "functions" : "function_call",
        "functions / function_call (the legacy API) are not supported; use tools and tool_choice");
  }
  if (auto ptc = get_bool(body, "parallel_tool_calls"); ptc && !*ptc) {
    bad_request(
        "parallel_tool_calls",
        "parallel_tool_calls: false is not supported (K3 may call several tools in one turn)");
  }
  // Images first: a bad one is a 400 naming its part, and a good one reaches the renderer as a
  // checked data URL (a fetched URL's bytes included; image_parts.h).
  json b = body;
  check_chat_images(b, limits.images);
  try {
    // The structure checks `deltafin render` shares; image parts pass where the model has a
    // tower (the renderer measures them).
    check_chat_body(b, ChatFormat::k3, static_cast<bool>(limits.measure_image));
  } catch (const InvalidArgument& e) {
    bad_request(param_of(e.what()), "{}", e.what());
  }

  // The K3 renderer takes low/high/max; OpenAI's minimal and medium map to low and high.
  if (const json* e = field(body, "reasoning_effort")) {
    if (!e->is_string())
      bad_request("reasoning_effort", "reasoning_effort: expected a string, got {}", type_name(*e));
    const std::string v = e->get<std::string>();
    std::string mapped = v == "minimal" ? "low" : v == "medium" ? "high" : v;
    if (mapped != "low" && mapped != "high" && mapped != "max") {
      bad_request("reasoning_effort",
                  "reasoning_effort: \"{}\" is not supported (minimal, low, medium, high or max)",
                  v);
    }
    b["reasoning_effort"] = mapped;
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object())
      bad_request("chat_template_kwargs", "chat_template_kwargs: expected an object");
    for (const auto& [key, v] : k->items()) {
      if (key != "thinking")
        bad_request("chat_template_kwargs",
                    "chat_template_kwargs.{} is not supported (only thinking)", key);
      if (!v.is_boolean())
        bad_request("chat_template_kwargs",
                    "chat_template_kwargs.thinking: expected true or false");
      if (field(body, "thinking") != nullptr && b["thinking"] != v) {
        bad_request("thinking", "thinking and chat_template_kwargs.thinking disagree");
      }
      b["thinking"] = v;
    }
  }
  b.erase("add_generation_prompt");  // not a field clients may set here (refused above anyway)
  try {
    r.chat = ChatRequest::from_json(b);
    name_images_by_client_path(b, r.chat->messages);  // errors name the part as the client sent it
    RenderedPrompt rendered = render(*r.chat, tok, limits.measure_image);
    r.prompt = std::move(rendered.ids);
    r.images = std::move(rendered.images);
    r.system_end = rendered.system_end;
    r.messages_end = rendered.messages_end;
    r.last_message = rendered.last_message;
  } catch (const InvalidArgument& e) {
    bad_request(param_of(e.what()), "{}", e.what());
  }
  r.params.chat = true;
  r.params.start_channel = r.chat->thinking ? Channel::think : Channel::response;
  r.params.constraint = chat_constraint(body, *r.chat, tok);
  check_context(r, limits, "messages");
  return r;
}

ServeRequest parse_completion_request(const json& body, const ServeLimits& limits,
                                      const Tokenizer& tok) {
  ServeRequest r;
  r.endpoint = Endpoint::completions;
  check_known_fields(body, Endpoint::completions);
  parse_common(body, limits, r,
               std::min<int64_t>(16, limits.max_tokens));  // OpenAI's default is 16
  if (auto lp = get_int(body, "logprobs", 0, 20)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*lp);
  }
  r.params.top_logprobs = r.logprobs ? r.top_logprobs : -1;
  require_default(body, "echo", false, "echoing the prompt is not implemented");
  if (const json* s = field(body, "suffix"); s != nullptr && *s != "") {
    bad_request("suffix", "suffix: insertion (fill in the middle) is not supported");
  }
  if (auto bo = get_int(body, "best_of", 1, std::numeric_limits<int32_t>::max()); bo && *bo != 1) {
    bad_request("best_of", "best_of: only 1 is supported, got {}", *bo);
  }

  const json* p = field(body, "prompt");
  if (p == nullptr)
    bad_request("prompt", "prompt: missing (expected a string or a list of token ids)");
  auto ids_of = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const auto& x : arr) {
      if (!x.is_number_integer() && !x.is_number_unsigned()) {
        bad_request("prompt", "prompt: a token-id list must hold integers only, got {}",
                    type_name(x));
      }
      const int64_t id =
          x.is_number_unsigned()
              ? static_cast<int64_t>(std::min<uint64_t>(x.get<uint64_t>(), INT64_MAX))
              : x.get<int64_t>();
      if (id < 0 || id >= std::min<int64_t>(limits.vocab, tok.vocab_size())) {
        bad_request("prompt", "prompt: token id {} is out of range (expected 0 to {})", id,
                    std::min<int64_t>(limits.vocab, tok.vocab_size()) - 1);
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt = tok.encode_ordinary(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad_request("prompt", "prompt: must not be empty");
    const json& first = (*p)[0];
    if (first.is_number()) {
      r.prompt = ids_of(*p);
    } else if (p->size() != 1) {
      bad_request("prompt", "prompt: only one prompt per request is supported, got {}", p->size());
    } else if (first.is_string()) {
      r.prompt = tok.encode_ordinary(first.get<std::string>());
    } else if (first.is_array()) {
      r.prompt = ids_of(first);
    } else {
      bad_request("prompt", "prompt: expected a string or a list of token ids, got a list of {}",
                  type_name(first));
    }
  } else {
    bad_request("prompt", "prompt: expected a string or a list of token ids, got {}",
                type_name(*p));
  }
  if (r.prompt.empty()) bad_request("prompt", "prompt: must not be empty");
  r.params.chat = false;
  r.params.constraint = completion_constraint(body, tok);
  check_context(r, limits, "prompt");
  return r;
}

}  // namespace deltafin::server
