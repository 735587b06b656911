// JSON text exactly as Python's `json.dumps(..., ensure_ascii=False)` writes it.
//
// The K3 prompt embeds JSON in two styles, and token ids depend on every byte: tool
// declarations and response schemas use `sort_keys=True, separators=(",", ":")`; typed tool-call
// arguments use the default separators `", "` / `": "` with the given key order. nlohmann's
// dump() differs in separators and in float formatting (it switches to exponent notation one
// decade earlier than Python's repr), so the text is produced here. Keys sort by code point
// (byte order of UTF-8), as Python's sort_keys does.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace deltafin {

enum class JsonStyle {
  compact_sorted,  // separators (",", ":"), keys sorted recursively
  python_default,  // separators (", ", ": "), keys in their given order
};

std::string python_json(const nlohmann::ordered_json& value, JsonStyle style);

// Python's repr() of a float (shortest round-trip digits; exponent form below 1e-4 and from
// 1e16 on; "1.0" not "1").
std::string python_float_repr(double v);

// Appends `s` as a JSON string literal (quotes included), escaping only what Python escapes
// with ensure_ascii=False: `"`, `\`, and control characters below U+0020.
void append_json_string(std::string& out, std::string_view s);

}  // namespace deltafin
