// UTF-8 helpers shared by the tokenizer, the chat renderer and the output parser.
//
// Token bytes are arbitrary: a BPE token may end in the middle of a character, and user input
// may not be valid UTF-8 at all. Everything here therefore works on raw bytes and classifies
// them with the Unicode "maximal subpart" rule (Unicode §3.9, Table 3-7), the same rule Python's
// `bytes.decode("utf-8", "replace")` and WHATWG use, so replacement output is predictable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deltafin::utf8 {

struct Decoded {
  enum class Status {
    ok,         // a well-formed scalar value of `len` bytes
    invalid,    // `len` bytes (at least 1) that can never start a well-formed character
    truncated,  // `len` bytes that are a valid prefix running into the end of the input
  };
  Status status;
  char32_t cp;  // the code point when ok, else 0
  std::size_t len;
};

// Classifies the sequence starting at s[i] (i < s.size()).
Decoded decode(std::string_view s, std::size_t i);

// Python's str.isspace() for one code point (the guard splitting of the reference tokenizer
// uses it): bidi classes WS/B/S plus Zs. Differs from Unicode White_Space on U+001C..U+001F.
bool py_isspace(char32_t cp);

// Python's str.strip() with no argument: removes leading/trailing py_isspace characters.
// Invalid bytes are never whitespace.
std::string_view py_strip(std::string_view s);

// Appends the UTF-8 encoding of `cp`.
void append(std::string& out, char32_t cp);

// Lossy conversion: well-formed characters are copied, every maximal invalid subpart (and a
// truncated tail) becomes U+FFFD.
std::string sanitize(std::string_view s);

// True when every byte belongs to a well-formed character.
bool is_valid(std::string_view s);

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace deltafin::utf8
