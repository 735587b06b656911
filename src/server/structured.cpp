#include "server/structured.h"

#include <string>

#include "core/error.h"
#include "grammar/k3_turn.h"
#include "server/api_error.h"

namespace deltafin::server {

using json = nlohmann::ordered_json;

namespace {

const json* present(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The field an error message starts with ("tools[0].function.parameters: ..." -> "tools").
std::string param_of_message(const std::string& msg, const std::string& fallback) {
  const size_t end = msg.find_first_of(".[:");
  return end == std::string::npos || end == 0 ? fallback : msg.substr(0, end);
}

template <typename F>
std::shared_ptr<const grammar::Constraint> compiled(const std::string& field, F&& f) {
  try {
    return std::make_shared<const grammar::Constraint>(f());
  } catch (const InvalidArgument& e) {
    bad_request(param_of_message(e.what(), field), "{}", e.what());
  }
}

std::string gbnf_text(const json& v) {
  if (!v.is_string()) bad_request("grammar", "grammar: expected a GBNF string");
  return v.get<std::string>();
}

const json& schema_of(const json& v, const char* field) {
  if (!v.is_object() && !v.is_boolean())
    bad_request(field, "{}: expected a JSON Schema object", field);
  return v;
}

// tool_choice {"type": "function", "function": {"name": ...}} (or Responses' {"name": ...}).
std::string named_function(const json& body) {
  const json* tc = present(body, "tool_choice");
  const json* f = tc != nullptr && tc->contains("function") ? &(*tc)["function"] : tc;
  if (f == nullptr || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
    bad_request(
        "tool_choice",
        "tool_choice: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}");
  return (*f)["name"].get<std::string>();
}

}  // namespace

std::shared_ptr<const grammar::Constraint> chat_constraint(const json& body,
                                                           const ChatRequest& chat,
                                                           const Tokenizer& tok) {
  grammar::TurnSpec spec;
  spec.thinking = chat.thinking;
  const json* g = present(body, "grammar");
  const json* js = present(body, "json_schema");
  const bool rf = chat.response_format != ChatRequest::ResponseFormat::text;
  if ((g != nullptr) + (js != nullptr) + rf > 1)
    bad_request(g ? "grammar" : "json_schema",
                "grammar, json_schema and a response_format other than text cannot be combined");
  if (g != nullptr) {
    spec.content = grammar::TurnSpec::Content::gbnf;
    spec.gbnf = gbnf_text(*g);
    spec.field = "grammar";
  } else if (js != nullptr) {
    spec.content = grammar::TurnSpec::Content::json_schema;
    spec.schema = schema_of(*js, "json_schema");
    spec.field = "json_schema";
  } else if (chat.response_format == ChatRequest::ResponseFormat::json_schema) {
    spec.content = grammar::TurnSpec::Content::json_schema;
    spec.schema = schema_of(chat.response_schema, "response_format");
    spec.field = "response_format.json_schema.schema";
  } else if (chat.response_format == ChatRequest::ResponseFormat::json_object) {
    spec.content = grammar::TurnSpec::Content::json_object;
    spec.field = "response_format";
  }
  const bool has_tools = chat.tools.is_array() && !chat.tools.empty();
  bool any_strict = false;
  if (has_tools) {
    spec.tools = chat.tools;
    for (const auto& t : chat.tools) {
      const json* f = t.contains("function") ? &t["function"] : nullptr;
      if (f && f->contains("strict") && (*f)["strict"] == true) any_strict = true;
    }
    switch (chat.tool_choice) {
      case ChatRequest::ToolChoice::none:
        spec.calls = grammar::TurnSpec::Calls::forbidden;
        break;
      case ChatRequest::ToolChoice::required:
        spec.calls = grammar::TurnSpec::Calls::required;
        spec.enforce_all_arguments = true;
        break;
      case ChatRequest::ToolChoice::named: {
        spec.calls = grammar::TurnSpec::Calls::required;
        spec.enforce_all_arguments = true;
        spec.named = named_function(body);
        bool listed = false;
        for (const auto& t : chat.tools) {
          const json* f = t.contains("function") ? &t["function"] : nullptr;
          listed = listed || (f != nullptr && f->value("name", "") == *spec.named);
        }
        if (!listed)
          bad_request("tool_choice",
                      "tool_choice: names function \"{}\", which is not among the tools",
                      *spec.named);
        break;
      }
      case ChatRequest::ToolChoice::unset:
      case ChatRequest::ToolChoice::auto_:
        spec.calls = grammar::TurnSpec::Calls::optional;
        break;
    }
  }
  const bool content = spec.content != grammar::TurnSpec::Content::free;
  const bool forced = spec.calls == grammar::TurnSpec::Calls::required;
  if (!content && !forced) {
    if (spec.calls != grammar::TurnSpec::Calls::optional || !any_strict) return nullptr;
    spec.lazy = true;
  }
  if (spec.field == "request") spec.field = "tools";
  return compiled(spec.field, [&] { return grammar::k3_turn_constraint(spec, tok); });
}

std::shared_ptr<const grammar::Constraint> completion_constraint(const json& body,
                                                                 const Tokenizer& tok) {
  const json* g = present(body, "grammar");
  const json* js = present(body, "json_schema");
  if (g != nullptr && js != nullptr)
    bad_request("grammar", "grammar and json_schema cannot be combined");
  if (g != nullptr)
    return compiled("grammar", [&] { return grammar::raw_constraint_gbnf(gbnf_text(*g), tok); });
  if (js != nullptr)
    return compiled("json_schema", [&] {
      return grammar::raw_constraint_schema(schema_of(*js, "json_schema"), tok, "json_schema");
    });
  return nullptr;
}

}  // namespace deltafin::server
