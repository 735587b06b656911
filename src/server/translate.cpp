// Shared translator helpers (see translate.h).
#include "server/translate.h"

#include <algorithm>
#include <limits>

#include "core/json_parse.h"

namespace deltafin::server::translate {

namespace {

std::string at(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

}  // namespace

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const char* type_name(const json& v) {
  return json_type_name(v.type());
}

void only_fields(const json& obj, std::initializer_list<const char*> known,
                 const std::string& path) {
  for (const auto& item : obj.items()) {
    const std::string& k = item.key();
    const bool ok = std::any_of(known.begin(), known.end(), [&](const char* n) { return k == n; });
    if (!ok) {
      const std::string p = path.empty() ? k : path + "." + k;
      bad_request(p, "{} is not supported by this server (refusing to silently ignore it)", p);
    }
  }
}

const json& need(const json& obj, const char* key, const std::string& path) {
  const json* v = field(obj, key);
  if (v == nullptr) bad_request(at(path, key), "{}: missing (required)", at(path, key));
  return *v;
}

std::string string_of(const json& v, const std::string& path) {
  if (!v.is_string()) bad_request(path, "{}: expected a string, got {}", path, type_name(v));
  return v.get<std::string>();
}

const json& array_of(const json& v, const std::string& path) {
  if (!v.is_array()) bad_request(path, "{}: expected an array, got {}", path, type_name(v));
  return v;
}

const json& object_of(const json& v, const std::string& path) {
  if (!v.is_object()) bad_request(path, "{}: expected an object, got {}", path, type_name(v));
  return v;
}

std::optional<bool> bool_field(const json& obj, const char* key, const std::string& path) {
  const json* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean())
    bad_request(at(path, key), "{}: expected true or false, got {}", at(path, key), type_name(*v));
  return v->get<bool>();
}

std::string k3_effort(const std::string& v, const std::string& param) {
  if (v == "minimal" || v == "low") return "low";
  if (v == "medium" || v == "high") return "high";
  if (v == "xhigh" || v == "max") return "max";
  bad_request(param, "{}: \"{}\" is not supported (low, medium, high or max)", param, v);
}

void force_tool(const std::string& name, json& tools, json& chat, const std::string& param) {
  json only = json::array();
  for (const auto& t : tools) {
    if (t["function"]["name"] == name) only.push_back(t);
  }
  if (only.empty()) bad_request(param, "{}: no function tool named \"{}\" in tools", param, name);
  tools = only;
  chat["tool_choice"] = "required";
}

json arguments_object(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_object()) return j;
  return {{"arguments", text}};
}

ServeRequest to_engine(const json& chat, const ServeLimits& limits, const Tokenizer& tok) {
  ServeLimits l = limits;
  l.images.checked = true;  // the translator's ImageGate checked each image with its own path
  return parse_chat_request(chat, l, tok);
}

ServeRequest to_engine_uncapped(const json& chat, const ServeLimits& limits, const Tokenizer& tok) {
  ServeLimits l = limits;
  l.images.checked = true;
  l.context = std::numeric_limits<int64_t>::max() / 2;
  l.max_tokens = l.context;
  return parse_chat_request(chat, l, tok);
}

}  // namespace deltafin::server::translate
