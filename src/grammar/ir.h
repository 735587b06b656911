// The grammar IR: what the GBNF parser, the JSON Schema compiler and the K3 turn grammar all
// produce, and what the compiler (pda.h) turns into a byte-level pushdown automaton.
//
// A Grammar is a list of named rules; each rule's body is an expression tree over terminals:
//  * bytes: a literal byte string (GBNF literals are their UTF-8 encoding);
//  * byte_class: a set of byte ranges (internal grammars only, e.g. "any byte" for free text);
//  * char_class: a set of Unicode scalar values (U+0000..U+10FFFF without surrogates), possibly
//    negated; compiled to the UTF-8 byte sequences of its members, so output is valid UTF-8 and
//    a character may be split across tokens;
//  * token: one whole token by id (`<[id]>`, `<|open|>`), or any whole token but one (`!<...>`);
//    tokens are matched only at token boundaries, and special tokens only this way;
// and the combinators seq, alt, repeat {min,max}, ref (a call of another rule) and intersect
// (both operands, which must be regular: no refs and no tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deltafin::grammar {

struct CharRange {
  char32_t lo, hi;  // inclusive
};
struct ByteRange {
  uint8_t lo, hi;  // inclusive
};

enum class ExprKind {
  empty,
  nothing,
  bytes,
  byte_class,
  char_class,
  seq,
  alt,
  repeat,
  ref,
  token,
  intersect
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

inline constexpr uint32_t kUnbounded = UINT32_MAX;
inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

struct Expr {
  ExprKind kind = ExprKind::empty;
  std::string bytes;                   // bytes
  std::vector<ByteRange> byte_ranges;  // byte_class: sorted, disjoint
  std::vector<CharRange> char_ranges;  // char_class: sorted, disjoint, scalar values only
  std::vector<ExprPtr> items;          // seq, alt, intersect (two)
  uint32_t min = 0, max = 0;           // repeat (items[0]); max may be kUnbounded
  uint32_t rule = 0;                   // ref
  int32_t token = -1;                  // token
  bool negated = false;                // token: any token but `token`
};

// Builders. They simplify a little (an empty seq is `empty`, a one-item seq is the item, nested
// seqs and alts are flattened) so the printer and the compiler see small trees.
ExprPtr empty();
ExprPtr nothing();
ExprPtr lit(std::string_view bytes);
ExprPtr bytes_of(std::vector<ByteRange> ranges);
// Sorted and merged; surrogates are removed; `negate` takes the complement in the scalar values.
ExprPtr chars(std::vector<CharRange> ranges, bool negate = false);
ExprPtr chr(char32_t c);
ExprPtr any_char();
ExprPtr seq(std::vector<ExprPtr> items);
ExprPtr alt(std::vector<ExprPtr> items);
ExprPtr repeat(ExprPtr e, uint32_t min, uint32_t max);
ExprPtr opt(ExprPtr e);
ExprPtr star(ExprPtr e);
ExprPtr plus(ExprPtr e);
ExprPtr ref(uint32_t rule);
ExprPtr token(int32_t id, bool negated = false);
ExprPtr intersect(ExprPtr a, ExprPtr b);

// Normalises a range list: sorted, merged, clipped to the scalar values (surrogates removed).
std::vector<CharRange> normalize(std::vector<CharRange> ranges);
std::vector<CharRange> complement(const std::vector<CharRange>& ranges);

struct Grammar {
  std::vector<std::string> names;
  std::vector<ExprPtr> rules;  // null until defined
  uint32_t root = 0;
  std::unordered_map<std::string, uint32_t> ids;

  // The id of rule `name`, adding an undefined rule when it is new.
  uint32_t rule_id(const std::string& name);
  // A new rule named `base` or `base-N` (the first free one).
  uint32_t fresh_rule(const std::string& base);
  void define(uint32_t id, ExprPtr body) { rules[id] = std::move(body); }
  size_t size() const { return rules.size(); }
};

// Copies `src`'s rules into `dst` (renamed under `prefix`); returns its root there (how a turn
// grammar embeds a user's GBNF grammar).
uint32_t import_rules(Grammar& dst, const Grammar& src, const std::string& prefix);

// The grammar in GBNF (for diagnostics and tests; byte classes print as `\xHH` ranges inside
// `[...]`, which GBNF would read as code points, so only grammars without them round-trip).
std::string to_gbnf(const Grammar& g);
std::string to_gbnf(const Grammar& g, const ExprPtr& e);

// True when `e` contains no ref and no token (so it can be intersected or inlined as a regular
// language). `visited` (optional) receives the number of subexpressions looked at.
bool is_regular(const ExprPtr& e, uint64_t* visited = nullptr);

}  // namespace deltafin::grammar
