// Standard base64 (RFC 4648 alphabet, `=` padding), as used by tiktoken rank files. Decoding is
// strict so a corrupt rank file is reported instead of silently yielding different tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace deltafin::base64 {

std::string encode(std::string_view bytes);

// nullopt when `text` is not canonical padded base64 (bad character, bad length, misplaced `=`).
std::optional<std::string> decode(std::string_view text);

}  // namespace deltafin::base64
