// Chat request bodies the OpenAI API refuses, each with the field its error must name: the
// server and `deltafin render` share one validator, and their tests share these cases.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace deltafin::test {

inline std::vector<std::pair<nlohmann::ordered_json, std::string>> invalid_chat_bodies() {
  using json = nlohmann::ordered_json;
  const json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  const json fn_x = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}};
  return {
      {{{"messages", user}, {"tools", json::array({{{"type", "function"}}})}}, "tools[0].function"},
      {{{"messages", user}, {"tools", json::array({fn_x})}}, "tools[0].function.parameters"},
      {{{"messages", user}, {"tool_choice", "required"}}, "tool_choice"},
      {{{"messages", user}, {"response_format", {{"type", "json_schema"}}}},
       "response_format.json_schema"},
      {{{"messages", json::array({{{"role", "user"}}})}}, "messages[0].content"},
  };
}

}  // namespace deltafin::test
