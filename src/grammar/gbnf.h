// GBNF, llama.cpp's grammar format, parsed into the grammar IR (ir.h).
//
// Syntax and meaning follow llama.cpp's grammar parser: rules `name ::= alternatives`, string
// literals with the escapes \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \] \-, character classes
// `[a-z]` / `[^...]`, `.` (any character), grouping, `* + ?`, `{m}` `{m,}` `{m,n}` (and `{,n}`),
// `#` comments, newlines inside parentheses and after `|`, and tokens: `<[id]>`, `<text>` (the one
// token whose text that is, e.g. K3's `<|open|>`) and `!<...>` (any one token but that one).
// Terminals are Unicode characters matched on the UTF-8 bytes of the output, so a character may
// be split across tokens. `root` is the start rule.
//
// Differences from llama.cpp, all deliberate: rule names may also contain `_`; a repetition count
// above kMaxRepeat is an error (llama.cpp treats an upper bound above 2000 as unbounded); text
// never matches a special token (K3's markers are produced only by a token element, so a
// grammar's text cannot fake the chat structure), and left recursion, an undefined rule, a rule
// that can never finish and a grammar larger than the limits are errors with the rule's name.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "grammar/ir.h"

namespace deltafin::grammar {

inline constexpr size_t kMaxGrammarBytes = 256 * 1024;
inline constexpr uint32_t kMaxRepeat = 2000;
inline constexpr int kMaxGroupNesting = 100;

// Resolves `<text>` token references: the id of the token whose text is exactly `text` (a
// special token's name, or an ordinary token's bytes), or nullopt. `vocab` bounds `<[id]>`.
struct TokenLookup {
  std::function<std::optional<int32_t>(std::string_view text)> find;
  int32_t vocab = 0;
};

// Parses `text`; throws InvalidArgument "grammar: line L, column C: ..." on a syntax error and
// "grammar: ..." naming the rule for an undefined rule or a missing root. `tokens` may be null
// when the grammar has no token references (else they are an error).
Grammar parse_gbnf(std::string_view text, const TokenLookup* tokens = nullptr);

}  // namespace deltafin::grammar
