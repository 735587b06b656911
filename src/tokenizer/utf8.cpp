// UTF-8 classification by Unicode Table 3-7 (well-formed byte sequences). Written out as a
// small table of second-byte ranges per lead byte so overlongs, surrogates and values above
// U+10FFFF are rejected at the first byte that proves them invalid.
#include "tokenizer/utf8.h"

namespace deltafin::utf8 {

namespace {

struct Lead {
  int len;               // total sequence length, 0 for an invalid lead byte
  unsigned char lo, hi;  // allowed range of the second byte
  char32_t bits;         // payload bits of the lead byte
};

Lead lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0, b};
  if (b < 0xC2) return {0, 0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF, static_cast<char32_t>(b & 0x1F)};
  if (b == 0xE0) return {3, 0xA0, 0xBF, 0};
  if (b == 0xED) return {3, 0x80, 0x9F, 0xD};
  if (b < 0xF0) return {3, 0x80, 0xBF, static_cast<char32_t>(b & 0x0F)};
  if (b == 0xF0) return {4, 0x90, 0xBF, 0};
  if (b < 0xF4) return {4, 0x80, 0xBF, static_cast<char32_t>(b & 0x07)};
  if (b == 0xF4) return {4, 0x80, 0x8F, 4};
  return {0, 0, 0, 0};
}

}  // namespace

Decoded decode(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const Lead lead = lead_info(b0);
  if (lead.len == 0) return {Decoded::Status::invalid, 0, 1};
  if (lead.len == 1) return {Decoded::Status::ok, lead.bits, 1};
  char32_t cp = lead.bits;
  for (int k = 1; k < lead.len; ++k) {
    const std::size_t at = i + static_cast<std::size_t>(k);
    if (at >= s.size()) return {Decoded::Status::truncated, 0, static_cast<std::size_t>(k)};
    const auto b = static_cast<unsigned char>(s[at]);
    const unsigned char lo = k == 1 ? lead.lo : 0x80;
    const unsigned char hi = k == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) return {Decoded::Status::invalid, 0, static_cast<std::size_t>(k)};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Decoded::Status::ok, cp, static_cast<std::size_t>(lead.len)};
}

bool py_isspace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  if (cp >= 0x1C && cp <= 0x20) return true;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view py_strip(std::string_view s) {
  std::size_t begin = 0;
  while (begin < s.size()) {
    const Decoded d = decode(s, begin);
    if (d.status != Decoded::Status::ok || !py_isspace(d.cp)) break;
    begin += d.len;
  }
  // Scan forward remembering where the last non-space character ended.
  std::size_t end = begin;
  for (std::size_t i = begin; i < s.size();) {
    const Decoded d = decode(s, i);
    i += d.len;
    if (d.status != Decoded::Status::ok || !py_isspace(d.cp)) end = i;
  }
  return s.substr(begin, end - begin);
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.status == Decoded::Status::ok) {
      out.append(s.substr(i, d.len));
    } else {
      out.append(kReplacement);
    }
    i += d.len;
  }
  return out;
}

bool is_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.status != Decoded::Status::ok) return false;
    i += d.len;
  }
  return true;
}

}  // namespace deltafin::utf8
