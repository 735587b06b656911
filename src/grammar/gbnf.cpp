#include "grammar/gbnf.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deltafin::grammar {

namespace {

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

class Parser {
 public:
  Parser(std::string_view text, const TokenLookup* tokens) : s_(text), tokens_(tokens) {}

  Grammar run() {
    if (s_.size() > kMaxGrammarBytes)
      fail_arg("grammar: {} bytes is larger than the limit of {} bytes", s_.size(),
               kMaxGrammarBytes);
    if (!utf8::is_valid(s_)) fail_arg("grammar: the text is not valid UTF-8");
    space(true);
    while (pos_ < s_.size()) rule();
    for (size_t i = 0; i < g_.rules.size(); ++i) {
      if (!g_.rules[i]) fail_arg("grammar: rule `{}` is used but never defined", g_.names[i]);
    }
    const auto it = g_.ids.find("root");
    if (it == g_.ids.end()) fail_arg("grammar: no `root` rule (the start of the grammar)");
    g_.root = it->second;
    return std::move(g_);
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail_arg("grammar: line {}, column {}: {}", line, col, what);
  }

  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  bool at_end() const { return pos_ >= s_.size(); }

  void space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\r' && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string name() {
    const size_t start = pos_;
    while (!at_end() && is_word(peek())) ++pos_;
    if (pos_ == start) error("expected a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t integer() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (!at_end() && is_digit(peek())) {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > 1'000'000'000) error("number too large");
      ++pos_;
    }
    if (pos_ == start) error("expected an integer");
    return static_cast<uint32_t>(v);
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        error(fmt::format("expected {} hex digits", digits));
      }
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class (escapes decoded).
  char32_t character() {
    if (at_end()) error("unexpected end of input");
    if (peek() == '\\') {
      ++pos_;
      const char c = peek();
      ++pos_;
      switch (c) {
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'n':
          return '\n';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          return static_cast<unsigned char>(c);
        default:
          pos_ -= 2;
          error(fmt::format("unknown escape \\{}",
                            c == '\0' ? std::string("(end)") : std::string(1, c)));
      }
    }
    const auto d = utf8::decode(s_, pos_);
    pos_ += d.len;
    return d.cp;
  }

  void rule() {
    const std::string n = name();
    space(false);
    if (s_.substr(pos_, 3) != "::=") error("expected ::= after the rule name `" + n + "`");
    pos_ += 3;
    space(true);
    const uint32_t id = g_.rule_id(n);
    if (g_.rules[id]) error("rule `" + n + "` is defined twice");
    g_.define(id, alternates(false, 0));
    if (peek() == '\r') {
      pos_ += peek(1) == '\n' ? 2 : 1;
    } else if (peek() == '\n') {
      ++pos_;
    } else if (!at_end()) {
      error(fmt::format("expected the end of the line, found `{}`", peek()));
    }
    space(true);
  }

  ExprPtr alternates(bool nested, int depth) {
    std::vector<ExprPtr> alts{sequence(nested, depth)};
    while (peek() == '|') {
      ++pos_;
      space(true);
      alts.push_back(sequence(nested, depth));
    }
    // An empty alternative is the empty string (alt() would otherwise drop nothing-only items).
    return alts.size() == 1 ? alts[0] : alt(std::move(alts));
  }

  ExprPtr sequence(bool nested, int depth) {
    std::vector<ExprPtr> items;
    while (!at_end()) {
      const char c = peek();
      if (c == '"') {
        ++pos_;
        std::string bytes;
        while (peek() != '"') {
          if (at_end()) error("unterminated string literal");
          const char32_t cp = character();
          if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            error(fmt::format("U+{:04X} is not a Unicode scalar value", static_cast<uint32_t>(cp)));
          utf8::append(bytes, cp);
        }
        ++pos_;
        items.push_back(lit(bytes));
      } else if (c == '[') {
        ++pos_;
        bool neg = false;
        if (peek() == '^') {
          neg = true;
          ++pos_;
        }
        std::vector<CharRange> ranges;
        while (peek() != ']') {
          if (at_end()) error("unterminated character class");
          const char32_t lo = character();
          char32_t hi = lo;
          if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
            ++pos_;
            hi = character();
          }
          if (hi < lo) error("character range is backwards");
          ranges.push_back({lo, hi});
        }
        ++pos_;
        items.push_back(chars(std::move(ranges), neg));
      } else if (c == '<' || c == '!') {
        items.push_back(token_ref());
      } else if (is_word(c)) {
        items.push_back(ref(g_.rule_id(name())));
      } else if (c == '(') {
        if (depth + 1 > kMaxGroupNesting)
          error(fmt::format("groups nested deeper than {}", kMaxGroupNesting));
        ++pos_;
        space(true);
        ExprPtr inner = alternates(true, depth + 1);
        if (peek() != ')') error("expected )");
        ++pos_;
        items.push_back(std::move(inner));
      } else if (c == '.') {
        ++pos_;
        items.push_back(any_char());
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (items.empty()) error(fmt::format("`{}` must follow an item", c));
        uint32_t lo = 0, hi = kUnbounded;
        ++pos_;
        if (c == '+') {
          lo = 1;
        } else if (c == '?') {
          hi = 1;
        } else if (c == '{') {
          space(nested);
          if (peek() != ',') lo = integer();
          space(nested);
          if (peek() == '}') {
            hi = lo;
          } else if (peek() == ',') {
            ++pos_;
            space(nested);
            if (is_digit(peek())) hi = integer();
            space(nested);
            if (peek() != '}') error("expected }");
          } else {
            error("expected , or }");
          }
          ++pos_;
          if (lo > kMaxRepeat || (hi != kUnbounded && hi > kMaxRepeat))
            error(fmt::format("repetition count above the limit of {}", kMaxRepeat));
          if (hi < lo) error("repetition {m,n} with n < m");
        }
        items.back() = repeat(items.back(), lo, hi);
      } else {
        break;
      }
      space(nested);
    }
    return seq(std::move(items));
  }

  ExprPtr token_ref() {
    bool neg = false;
    if (peek() == '!') {
      neg = true;
      ++pos_;
    }
    if (peek() != '<') error("expected < after !");
    const size_t start = pos_;
    ++pos_;
    int32_t id = -1;
    if (peek() == '[') {
      ++pos_;
      const uint32_t v = integer();
      if (peek() != ']') error("expected ] in <[id]>");
      ++pos_;
      if (peek() != '>') error("expected > in <[id]>");
      ++pos_;
      if (tokens_ == nullptr) error("token references need a tokenizer");
      if (v >= static_cast<uint32_t>(tokens_->vocab))
        error(fmt::format("token id {} is outside the vocabulary of {}", v, tokens_->vocab));
      id = static_cast<int32_t>(v);
    } else {
      while (!at_end() && peek() != '>') ++pos_;
      if (at_end()) error("expected > closing a token");
      ++pos_;
      const std::string_view text = s_.substr(start, pos_ - start);
      if (tokens_ == nullptr) error("token references need a tokenizer");
      const auto found = tokens_->find(text);
      if (!found) error(fmt::format("`{}` is not one token of this tokenizer", text));
      id = *found;
    }
    return token(id, neg);
  }

  std::string_view s_;
  size_t pos_ = 0;
  const TokenLookup* tokens_;
  Grammar g_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, const TokenLookup* tokens) {
  return Parser(text, tokens).run();
}

}  // namespace deltafin::grammar
