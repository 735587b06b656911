// Python-compatible JSON text; see json_text.h for why nlohmann's dump() is not used.
#include "tokenizer/json_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace deltafin {

namespace {

void write(std::string& out, const nlohmann::ordered_json& v, JsonStyle style) {
  const bool sorted = style == JsonStyle::compact_sorted;
  const char* item_sep = sorted ? "," : ", ";
  const char* key_sep = sorted ? ":" : ": ";
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      std::vector<const nlohmann::ordered_json::object_t::value_type*> items;
      for (const auto& kv : v.get_ref<const nlohmann::ordered_json::object_t&>())
        items.push_back(&kv);
      if (sorted) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        append_json_string(out, items[i]->first);
        out += key_sep;
        write(out, items[i]->second, style);
      }
      out += '}';
      return;
    }
    case nlohmann::ordered_json::value_t::array:
      out += '[';
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += item_sep;
        write(out, v[i], style);
      }
      out += ']';
      return;
    case nlohmann::ordered_json::value_t::string:
      append_json_string(out, v.get_ref<const std::string&>());
      return;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case nlohmann::ordered_json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_float:
      out += python_float_repr(v.get<double>());
      return;
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
    case nlohmann::ordered_json::value_t::binary:
      out += "null";
      return;
  }
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));  // [-]d[.ddd]e[+-]XX
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const std::size_t e = sci.find('e');
  std::string digits;
  for (const char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // value = 0.<digits> * 10^decpt
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += 'e';
    out += exp10 < 0 ? '-' : '+';
    const int a = std::abs(exp10);
    if (a < 10) out += '0';
    out += std::to_string(a);
    return out;
  }
  if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(static_cast<std::size_t>(decpt) - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

std::string python_json(const nlohmann::ordered_json& value, JsonStyle style) {
  std::string out;
  write(out, value, style);
  return out;
}

}  // namespace deltafin
