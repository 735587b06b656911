// Parsing JSON that comes from outside (request bodies, config and tokenizer files, saved chats,
// shard headers): one entry point, so every such text gets the same nesting limit and the same
// clean errors.
//
// nlohmann's parser recurses once per nesting level, so a body of 100,000 '[' overflows the
// stack before it can fail; the depth is therefore checked on the raw text (outside strings)
// before parsing. Its exceptions carry a "[json.exception.parse_error.101] " prefix that means
// nothing to a user; errors here name what was being read and drop the prefix.
#pragma once

#include <cstddef>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deltafin {

// The deepest nesting any JSON input may have (objects and arrays); the server, render, chat
// /load, config, tokenizer and checkpoint files share it (docs/SERVER.md names it).
inline constexpr size_t kMaxJsonDepth = 64;

// Throws InvalidArgument "WHAT: nests deeper than N levels (...)" when `text` does.
void check_json_depth(std::string_view text, size_t max_depth, const std::string& what);

// Parses `text` after the depth check. Throws InvalidArgument "WHAT: not valid JSON: MESSAGE".
nlohmann::json parse_json(std::string_view text, const std::string& what,
                          size_t max_depth = kMaxJsonDepth);
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what,
                                          size_t max_depth = kMaxJsonDepth);

// "an object", "a string", ... for messages that say what was found instead.
const char* json_type_name(nlohmann::json::value_t type);

// e.what() without nlohmann's "[json.exception.KIND.N] " prefix (other exceptions unchanged).
std::string json_error_text(const std::exception& e);

}  // namespace deltafin
