// The regular-expression subset of JSON Schema's `pattern` (ECMA-262 syntax), as grammar IR
// over the characters of the decoded string.
//
// Supported: literals and escaped punctuation; `.` (any character but \n \r U+2028 U+2029);
// classes `[...]`, `[^...]` with ranges; \d \D \w \W \s \S (inside classes too); \t \n \r \v
// \f \0 \xHH \uHHHH \u{H...}; groups `(...)`, `(?:...)`, `(?<name>...)`; alternation `|`;
// quantifiers `* + ? {m} {m,} {m,n}` (a lazy `?` after one is accepted: it does not change what
// matches); `^` at the start and `$` at the end of a top-level alternative. As in JSON Schema a
// pattern is not anchored: a side without `^` / `$` may be preceded / followed by anything.
// Not supported (an InvalidArgument naming it): backreferences, lookaround, \b \B, \p{...},
// \cX, anchors elsewhere. Limits: kMaxPatternBytes, counts up to kMaxPatternRepeat, groups
// nested up to kMaxPatternNesting.
#pragma once

#include <string_view>

#include "grammar/ir.h"

namespace deltafin::grammar {

inline constexpr size_t kMaxPatternBytes = 1000;
inline constexpr uint32_t kMaxPatternRepeat = 1000;
inline constexpr int kMaxPatternNesting = 50;

// Throws InvalidArgument "pattern: ..." for what the subset does not cover.
ExprPtr parse_pattern(std::string_view pattern);

}  // namespace deltafin::grammar
