#include "grammar/regex.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deltafin::grammar {

namespace {

std::vector<CharRange> digit() {
  return {{'0', '9'}};
}
std::vector<CharRange> word() {
  return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
}
std::vector<CharRange> space() {
  // ECMA-262 WhiteSpace and LineTerminator.
  return {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view s) : s_(s) {}

  ExprPtr run() {
    if (s_.size() > kMaxPatternBytes)
      fail_arg("pattern: {} bytes is longer than the limit of {}", s_.size(), kMaxPatternBytes);
    if (!utf8::is_valid(s_)) fail_arg("pattern: not valid UTF-8");
    // Top level: alternatives, each anchored or padded on its own.
    std::vector<ExprPtr> alts;
    for (;;) {
      bool start = false, end = false;
      if (peek() == '^') {
        start = true;
        ++pos_;
      }
      ExprPtr body = sequence(0, &end);
      alts.push_back(
          seq({start ? empty() : star(any_char()), body, end ? empty() : star(any_char())}));
      if (at_end()) break;
      if (peek() != '|') error("unbalanced )");
      ++pos_;
    }
    return alt(std::move(alts));
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail_arg("pattern: {} at offset {} of \"{}\"", what, pos_, s_);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

  char32_t next_char() {
    const auto d = utf8::decode(s_, pos_);
    pos_ += d.len;
    return d.cp;
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      const char c = peek();
      if (!std::isxdigit(static_cast<unsigned char>(c))) error("expected a hex digit");
      v = v * 16 +
          static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                    ? c - '0'
                                    : (std::tolower(static_cast<unsigned char>(c)) - 'a' + 10));
      ++pos_;
    }
    return v;
  }

  // After a backslash: a set of characters (class escapes) or one character.
  std::vector<CharRange> escape(bool in_class) {
    if (at_end()) error("trailing backslash");
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'd':
        return digit();
      case 'D':
        return complement(digit());
      case 'w':
        return word();
      case 'W':
        return complement(word());
      case 's':
        return space();
      case 'S':
        return complement(space());
      case 't':
        return {{'\t', '\t'}};
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'v':
        return {{'\v', '\v'}};
      case 'f':
        return {{'\f', '\f'}};
      case '0':
        if (std::isdigit(static_cast<unsigned char>(peek())))
          error("octal escapes are not supported");
        return {{0, 0}};
      case 'x': {
        const char32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        char32_t v;
        if (peek() == '{') {
          ++pos_;
          v = 0;
          size_t n = 0;
          while (peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 6) error("\\u{...} too long");
          }
          ++pos_;
        } else {
          v = hex(4);
        }
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        error("word boundaries (\\b) are not supported");
      case 'B':
        error("\\B is not supported");
      case 'p':
      case 'P':
        error("Unicode property escapes (\\p{...}) are not supported");
      case 'c':
        error("control escapes (\\cX) are not supported");
      case 'k':
        error("named backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c)))
          error(fmt::format("unknown escape \\{}", c));
        --pos_;
        const char32_t v = next_char();  // escaped punctuation (or any other character)
        return {{v, v}};
    }
  }

  ExprPtr char_class() {
    // After '['.
    bool neg = false;
    if (peek() == '^') {
      neg = true;
      ++pos_;
    }
    std::vector<CharRange> set;  // `[]` matches nothing and `[^]` anything, as in ECMA-262
    while (peek() != ']') {
      if (at_end()) error("unterminated character class");
      std::vector<CharRange> lo;
      if (peek() == '\\') {
        ++pos_;
        lo = escape(true);
      } else {
        const char32_t c = next_char();
        lo = {{c, c}};
      }
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size() && lo.size() == 1 &&
          lo[0].lo == lo[0].hi) {
        ++pos_;
        std::vector<CharRange> hi;
        if (peek() == '\\') {
          ++pos_;
          hi = escape(true);
        } else {
          const char32_t c = next_char();
          hi = {{c, c}};
        }
        if (hi.size() != 1 || hi[0].lo != hi[0].hi) error("a class escape cannot end a range");
        if (hi[0].lo < lo[0].lo) error("character range out of order");
        set.push_back({lo[0].lo, hi[0].lo});
      } else {
        set.insert(set.end(), lo.begin(), lo.end());
      }
    }
    ++pos_;
    return chars(std::move(set), neg);
  }

  bool quantifier(uint32_t& lo, uint32_t& hi) {
    const char c = peek();
    if (c == '*') {
      lo = 0;
      hi = kUnbounded;
    } else if (c == '+') {
      lo = 1;
      hi = kUnbounded;
    } else if (c == '?') {
      lo = 0;
      hi = 1;
    } else if (c == '{') {
      // `{` not followed by a valid count is a literal in ECMA-262 (Annex B); keep it strict.
      size_t p = pos_ + 1;
      auto number = [&](uint32_t& v) {
        const size_t start = p;
        uint64_t n = 0;
        while (p < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p]))) {
          n = n * 10 + static_cast<uint64_t>(s_[p] - '0');
          if (n > kMaxPatternRepeat) {
            pos_ = start;
            error(fmt::format("repetition count above the limit of {}", kMaxPatternRepeat));
          }
          ++p;
        }
        v = static_cast<uint32_t>(n);
        return p > start;
      };
      if (!number(lo)) error("expected a count after {");
      hi = lo;
      if (p < s_.size() && s_[p] == ',') {
        ++p;
        if (!number(hi)) hi = kUnbounded;
      }
      if (p >= s_.size() || s_[p] != '}') error("expected } closing a count");
      pos_ = p;
      if (hi < lo) error("repetition {m,n} with n < m");
    } else {
      return false;
    }
    ++pos_;
    if (peek() == '?') ++pos_;  // lazy: same language
    return true;
  }

  // A sequence up to '|' or ')' (or the end). At depth 0 a final `$` sets *end.
  ExprPtr sequence(int depth, bool* end) {
    std::vector<ExprPtr> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const char c = peek();
      ExprPtr atom;
      if (c == '$') {
        ++pos_;
        if (depth == 0 && (at_end() || peek() == '|')) {
          *end = true;
          break;
        }
        error("$ is supported only at the end of the pattern");
      } else if (c == '^') {
        error("^ is supported only at the start of the pattern");
      } else if (c == '(') {
        if (depth + 1 > kMaxPatternNesting)
          error(fmt::format("groups nested deeper than {}", kMaxPatternNesting));
        ++pos_;
        if (peek() == '?') {
          if (peek(1) == ':') {
            pos_ += 2;
          } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {
            while (!at_end() && peek() != '>') ++pos_;
            if (at_end()) error("unterminated group name");
            ++pos_;
          } else {
            error("lookaround and other (?...) groups are not supported");
          }
        }
        std::vector<ExprPtr> alts{sequence(depth + 1, nullptr)};
        while (peek() == '|') {
          ++pos_;
          alts.push_back(sequence(depth + 1, nullptr));
        }
        if (peek() != ')') error("missing )");
        ++pos_;
        atom = alt(std::move(alts));
      } else if (c == '[') {
        ++pos_;
        atom = char_class();
      } else if (c == '.') {
        ++pos_;
        atom = chars({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true);
      } else if (c == '\\') {
        ++pos_;
        atom = chars(escape(false));
      } else if (c == '*' || c == '+' || c == '?') {
        error(fmt::format("nothing to repeat before {}", c));
      } else {
        const char32_t cp = next_char();
        atom = chr(cp);
      }
      uint32_t lo = 1, hi = 1;
      if (quantifier(lo, hi)) {
        atom = repeat(atom, lo, hi);
        uint32_t l2, h2;
        if (quantifier(l2, h2)) error("nested quantifier");
      }
      items.push_back(std::move(atom));
    }
    return seq(std::move(items));
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

ExprPtr parse_pattern(std::string_view pattern) {
  return RegexParser(pattern).run();
}

}  // namespace deltafin::grammar
