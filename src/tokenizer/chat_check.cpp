// The shared chat request validator (see chat_check.h). Each check names the field by its path,
// as the server's 400 responses carry it in `param`; the few rules that differ by chat format
// take the format.
#include "tokenizer/chat_check.h"

#include <fmt/format.h>

#include <set>
#include <string>

#include "core/error.h"
#include "core/json_parse.h"

namespace deltafin {

namespace {

using json = nlohmann::ordered_json;

const json* present(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A string value equal to `s` (compared as std::string: comparing json with a C string trips a
// GCC 12 -Warray-bounds false positive under -Werror).
bool is(const json* v, const char* s) {
  return v != nullptr && v->is_string() && v->get_ref<const std::string&>() == s;
}

void check_tools(const json& body) {
  const json* tools = present(body, "tools");
  if (tools == nullptr) return;
  if (!tools->is_array())
    fail_arg("tools: expected an array, got {}", json_type_name(tools->type()));
  if (tools->size() > kMaxTools)
    fail_arg("tools: at most {} tools, got {}", kMaxTools, tools->size());
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) fail_arg("{}: expected a tool object, got {}", p, json_type_name(t.type()));
    const json* type = present(t, "type");
    if (!is(type, "function")) fail_arg("{}.type: only \"function\" tools are supported", p);
    const json* fn = present(t, "function");
    if (fn == nullptr || !fn->is_object())
      fail_arg("{}.function: expected an object with the function's name", p);
    const json* name = present(*fn, "name");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty())
      fail_arg("{}.function.name: expected a non-empty string", p);
    if (const json* d = present(*fn, "description"); d != nullptr && !d->is_string())
      fail_arg("{}.function.description: expected a string, got {}", p, json_type_name(d->type()));
    if (const json* params = present(*fn, "parameters"); params != nullptr && !params->is_object())
      fail_arg("{}.function.parameters: expected a JSON Schema object, got {}", p,
               json_type_name(params->type()));
  }
}

void check_tool_choice(const json& body) {
  const json* tc = present(body, "tool_choice");
  if (!is(tc, "required")) return;
  const json* tools = present(body, "tools");
  if (tools == nullptr || (tools->is_array() && tools->empty()))
    fail_arg("tool_choice: \"required\" needs at least one tool in tools");
}

void check_response_format(const json& body) {
  const json* rf = present(body, "response_format");
  if (rf == nullptr || !rf->is_object()) return;  // from_json names other shapes
  const json* type = present(*rf, "type");
  if (!is(type, "json_schema")) return;
  const json* js = present(*rf, "json_schema");
  if (js == nullptr || !js->is_object()) {
    fail_arg(
        "response_format.json_schema: expected an object with the schema (type \"json_schema\" "
        "needs it), got {}",
        js == nullptr ? "nothing" : json_type_name(js->type()));
  }
  if (const json* s = present(*js, "schema"); s != nullptr && !s->is_object() && !s->is_boolean())
    fail_arg("response_format.json_schema.schema: expected a JSON Schema object, got {}",
             json_type_name(s->type()));
}

void check_messages(const json& body, ChatFormat format, bool images) {
  static const std::set<std::string> known = {
      "role",  "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
      "tools", "tool",    "id",   "refusal",    "audio",        "function_call",     "annotations"};
  const json* msgs = present(body, "messages");
  if (msgs == nullptr) fail_arg("messages: missing (expected an array of messages)");
  if (!msgs->is_array())
    fail_arg("messages: expected an array of messages, got {}", json_type_name(msgs->type()));
  if (msgs->empty()) fail_arg("messages: must not be empty");
  if (msgs->size() > kMaxMessages)
    fail_arg("messages: at most {} messages, got {}", kMaxMessages, msgs->size());
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string path = fmt::format("messages[{}]", i);
    if (!m.is_object())
      fail_arg("{}: expected a message object, got {}", path, json_type_name(m.type()));
    for (const auto& [k, v] : m.items()) {
      if (known.count(k) == 0) fail_arg("{}.{}: is not supported", path, k);
      if ((k == "refusal" || k == "audio" || k == "function_call") && !v.is_null())
        fail_arg("{}.{}: only null is supported", path, k);
      if (k == "annotations" && !v.is_null() && !(v.is_array() && v.empty()))
        fail_arg("{}.annotations: only an empty list is supported", path);
    }
    const json* role = present(m, "role");
    const json* c = present(m, "content");
    // Only an assistant turn that calls tools and a system message that declares tools (K3's
    // dynamic tool declaration, rendered from `tools` alone) may leave their content out.
    const bool calls = present(m, "tool_calls") != nullptr;
    const json* tools = present(m, "tools");
    if (tools != nullptr && is_k2_family(format)) {
      fail_arg(
          "{}.tools: not supported by the {} chat format (a system message declaring tools is "
          "K3's; declare the tools in the request's tools)",
          path, chat_format_name(format));
    }
    const bool declares = tools != nullptr && tools->is_array() && !tools->empty();
    if (c == nullptr && role != nullptr && role->is_string() && !(is(role, "assistant") && calls) &&
        !(is(role, "system") && declares))
      fail_arg("{}.content: missing (a {} message needs content)", path,
               role->get_ref<const std::string&>());
    if (c == nullptr || !c->is_array()) continue;
    for (size_t j = 0; j < c->size(); ++j) {
      const json& part = (*c)[j];
      const std::string pp = fmt::format("{}.content[{}]", path, j);
      if (!part.is_object())
        fail_arg("{}: expected a content part object, got {}", pp, json_type_name(part.type()));
      const json* t = present(part, "type");
      if (t != nullptr && !is(t, "text")) {
        if (images && !is_k2_family(format) && (is(t, "image_url") || is(t, "image"))) continue;
        if (is_k2_family(format)) {
          fail_arg("{}: only text content is supported (the {} text model), got a {} part", pp,
                   chat_format_name(format), t->dump());
        }
        fail_arg("{}: only text content is supported (this is the K3 text model), got a {} part",
                 pp, t->dump());
      }
    }
  }
}

}  // namespace

void check_chat_body(const json& body, ChatFormat format, bool images) {
  if (!body.is_object())
    fail_arg("request: expected a JSON object, got {}", json_type_name(body.type()));
  check_tools(body);
  check_tool_choice(body);
  check_response_format(body);
  check_messages(body, format, images);
}

void check_chat_body(const json& body) {
  check_chat_body(body, ChatFormat::k3);
}

}  // namespace deltafin
