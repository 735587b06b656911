// One JSON entry point with a depth limit and clean errors (see json_parse.h).
#include "core/json_parse.h"

#include "core/error.h"

namespace deltafin {

void check_json_depth(std::string_view text, size_t max_depth, const std::string& what) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        fail_arg("{}: nests deeper than {} levels (objects and arrays; the limit is {})", what,
                 max_depth, max_depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

const char* json_type_name(nlohmann::json::value_t type) {
  using V = nlohmann::json::value_t;
  switch (type) {
    case V::null:
      return "null";
    case V::object:
      return "an object";
    case V::array:
      return "an array";
    case V::string:
      return "a string";
    case V::boolean:
      return "a boolean";
    case V::number_integer:
    case V::number_unsigned:
      return "an integer";
    case V::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

std::string json_error_text(const std::exception& e) {
  std::string s = e.what();
  if (dynamic_cast<const nlohmann::json::exception*>(&e) != nullptr && s.rfind("[json.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s;
}

namespace {
template <typename Json>
Json parse_as(std::string_view text, const std::string& what, size_t max_depth) {
  check_json_depth(text, max_depth, what);
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_arg("{}: not valid JSON: {}", what, json_error_text(e));
  }
}
}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& what, size_t max_depth) {
  return parse_as<nlohmann::json>(text, what, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what,
                                          size_t max_depth) {
  return parse_as<nlohmann::ordered_json>(text, what, max_depth);
}

}  // namespace deltafin
