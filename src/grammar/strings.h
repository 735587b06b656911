// Strings for the JSON Schema compiler: the `format`s it supports (as grammar IR over the
// decoded characters), and the step from decoded characters to JSON string text (every
// character that JSON must escape becomes its escape, so a constraint on the decoded string,
// a `pattern` say, holds exactly for what a JSON parser reads back).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/ir.h"

namespace deltafin::grammar {

// The decoded text of a string in `format` (date, time, date-time, uuid, email, ipv4,
// hostname, uri), or an InvalidArgument naming `path` for another format.
ExprPtr format_text(const std::string& format, const std::string& path);
const std::vector<std::string>& supported_formats();

// The JSON string-content text (without quotes) of the decoded strings `decoded` matches:
// `"`, `\` and control characters become escapes (\" \\ \n \t \r \b \f, else \u00XX).
// `decoded` must be regular.
ExprPtr json_escaped(const ExprPtr& decoded);

// One JSON string character as the grammar allows it in free text: any character but `"`, `\`
// and controls, or an escape (\" \\ \/ \b \f \n \r \t, or \uXXXX of a non-surrogate).
ExprPtr json_char();

// `s` as a JSON string literal (quotes included), non-ASCII kept as UTF-8.
std::string json_quote(std::string_view s);

}  // namespace deltafin::grammar
