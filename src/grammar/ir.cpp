#include "grammar/ir.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "tokenizer/utf8.h"

namespace deltafin::grammar {

namespace {

std::shared_ptr<Expr> make(ExprKind k) {
  auto e = std::make_shared<Expr>();
  e->kind = k;
  return e;
}

const ExprPtr& empty_singleton() {
  static const ExprPtr e = make(ExprKind::empty);
  return e;
}

const ExprPtr& nothing_singleton() {
  static const ExprPtr e = make(ExprKind::nothing);
  return e;
}

}  // namespace

std::vector<CharRange> normalize(std::vector<CharRange> ranges) {
  std::vector<CharRange> clipped;
  for (CharRange r : ranges) {
    if (r.lo > r.hi || r.lo > kMaxCodePoint) continue;
    r.hi = std::min(r.hi, kMaxCodePoint);
    // Surrogates are not scalar values: cut them out.
    if (r.lo < 0xD800 && r.hi >= 0xD800) {
      clipped.push_back({r.lo, 0xD7FF});
      if (r.hi > 0xDFFF) clipped.push_back({0xE000, r.hi});
    } else if (r.lo >= 0xD800 && r.lo <= 0xDFFF) {
      if (r.hi > 0xDFFF) clipped.push_back({0xE000, r.hi});
    } else {
      clipped.push_back(r);
    }
  }
  std::sort(clipped.begin(), clipped.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  std::vector<CharRange> out;
  for (const CharRange& r : clipped) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CharRange> complement(const std::vector<CharRange>& ranges) {
  const std::vector<CharRange> in = normalize(ranges);
  std::vector<CharRange> out;
  char32_t next = 0;
  for (const CharRange& r : in) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize(std::move(out));
}

ExprPtr empty() {
  return empty_singleton();
}

ExprPtr nothing() {
  return nothing_singleton();
}

ExprPtr lit(std::string_view bytes) {
  if (bytes.empty()) return empty();
  auto e = make(ExprKind::bytes);
  e->bytes = std::string(bytes);
  return e;
}

ExprPtr bytes_of(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.lo < b.lo; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (r.lo > r.hi) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (merged.empty()) return nothing();
  auto e = make(ExprKind::byte_class);
  e->byte_ranges = std::move(merged);
  return e;
}

ExprPtr chars(std::vector<CharRange> ranges, bool negate) {
  std::vector<CharRange> r = negate ? complement(ranges) : normalize(std::move(ranges));
  if (r.empty()) return nothing();
  auto e = make(ExprKind::char_class);
  e->char_ranges = std::move(r);
  return e;
}

ExprPtr chr(char32_t c) {
  return chars({{c, c}});
}

ExprPtr any_char() {
  return chars({{0, kMaxCodePoint}});
}

ExprPtr seq(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (it->kind == ExprKind::empty) continue;
    if (it->kind == ExprKind::nothing) return nothing();
    if (it->kind == ExprKind::seq) {
      flat.insert(flat.end(), it->items.begin(), it->items.end());
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.empty()) return empty();
  if (flat.size() == 1) return flat[0];
  auto e = make(ExprKind::seq);
  e->items = std::move(flat);
  return e;
}

ExprPtr alt(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (it->kind == ExprKind::nothing) continue;
    if (it->kind == ExprKind::alt) {
      flat.insert(flat.end(), it->items.begin(), it->items.end());
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.empty()) return nothing();
  if (flat.size() == 1) return flat[0];
  auto e = make(ExprKind::alt);
  e->items = std::move(flat);
  return e;
}

ExprPtr repeat(ExprPtr x, uint32_t min, uint32_t max) {
  if (max == 0 || x->kind == ExprKind::empty) return empty();
  if (x->kind == ExprKind::nothing) return min == 0 ? empty() : nothing();
  if (min == 1 && max == 1) return x;
  auto e = make(ExprKind::repeat);
  e->items = {std::move(x)};
  e->min = min;
  e->max = max;
  return e;
}

ExprPtr opt(ExprPtr e) {
  return repeat(std::move(e), 0, 1);
}
ExprPtr star(ExprPtr e) {
  return repeat(std::move(e), 0, kUnbounded);
}
ExprPtr plus(ExprPtr e) {
  return repeat(std::move(e), 1, kUnbounded);
}

ExprPtr ref(uint32_t rule) {
  auto e = make(ExprKind::ref);
  e->rule = rule;
  return e;
}

ExprPtr token(int32_t id, bool negated) {
  auto e = make(ExprKind::token);
  e->token = id;
  e->negated = negated;
  return e;
}

ExprPtr intersect(ExprPtr a, ExprPtr b) {
  if (a->kind == ExprKind::nothing || b->kind == ExprKind::nothing) return nothing();
  auto e = make(ExprKind::intersect);
  e->items = {std::move(a), std::move(b)};
  return e;
}

uint32_t Grammar::rule_id(const std::string& name) {
  if (auto it = ids.find(name); it != ids.end()) return it->second;
  const auto id = static_cast<uint32_t>(rules.size());
  names.push_back(name);
  rules.push_back(nullptr);
  ids.emplace(name, id);
  return id;
}

uint32_t Grammar::fresh_rule(const std::string& base) {
  if (!ids.contains(base)) return rule_id(base);
  for (size_t n = 1;; ++n) {
    std::string name = fmt::format("{}-{}", base, n);
    if (!ids.contains(name)) return rule_id(name);
  }
}

bool is_regular(const ExprPtr& e, uint64_t* visited) {
  // Iterative, each shared subexpression once: a DAG's paths can be exponentially many.
  std::vector<const Expr*> todo{e.get()};
  std::unordered_set<const Expr*> seen;
  bool regular = true;
  while (!todo.empty() && regular) {
    const Expr* x = todo.back();
    todo.pop_back();
    if (!seen.insert(x).second) continue;
    if (x->kind == ExprKind::ref || x->kind == ExprKind::token) regular = false;
    for (const auto& it : x->items) todo.push_back(it.get());
  }
  if (visited != nullptr) *visited = seen.size();
  return regular;
}

namespace {

void print_char(std::string& out, char32_t c, bool in_class) {
  switch (c) {
    case '\n':
      out += "\\n";
      return;
    case '\t':
      out += "\\t";
      return;
    case '\r':
      out += "\\r";
      return;
    case '\\':
      out += "\\\\";
      return;
    case '"':
      out += in_class ? "\"" : "\\\"";
      return;
    case ']':
    case '[':
    case '-':
    case '^':
      if (in_class) {
        out += '\\';
        out += static_cast<char>(c);
        return;
      }
      break;
    default:
      break;
  }
  if (c < 0x20 || c == 0x7F) {
    out += fmt::format("\\x{:02X}", static_cast<unsigned>(c));
  } else if (c > 0xFFFF) {
    out += fmt::format("\\U{:08X}", static_cast<unsigned>(c));
  } else if (c > 0x7E) {
    out += fmt::format("\\u{:04X}", static_cast<unsigned>(c));
  } else {
    out += static_cast<char>(c);
  }
}

void print(const Grammar& g, const ExprPtr& e, std::string& out, bool nested) {
  switch (e->kind) {
    case ExprKind::empty:
      out += "\"\"";
      return;
    case ExprKind::nothing:
      out += "[^\\x00-\\U0010FFFF]";
      return;
    case ExprKind::bytes: {
      out += '"';
      std::string_view s = e->bytes;
      for (size_t i = 0; i < s.size();) {
        const auto d = utf8::decode(s, i);
        if (d.status == utf8::Decoded::Status::ok) {
          print_char(out, d.cp, false);
          i += d.len;
        } else {
          out += fmt::format("\\x{:02X}", static_cast<unsigned char>(s[i]));
          ++i;
        }
      }
      out += '"';
      return;
    }
    case ExprKind::byte_class:
      out += '[';
      for (const auto& r : e->byte_ranges) {
        out += fmt::format("\\x{:02X}", r.lo);
        if (r.hi != r.lo) out += fmt::format("-\\x{:02X}", r.hi);
      }
      out += ']';
      return;
    case ExprKind::char_class: {
      if (e->char_ranges.size() == 1 && e->char_ranges[0].lo == 0 &&
          e->char_ranges[0].hi == kMaxCodePoint) {
        out += '.';
        return;
      }
      // Print the shorter of the set and its complement.
      const auto comp = complement(e->char_ranges);
      const bool neg = comp.size() < e->char_ranges.size();
      out += neg ? "[^" : "[";
      for (const auto& r : neg ? comp : e->char_ranges) {
        print_char(out, r.lo, true);
        if (r.hi != r.lo) {
          out += '-';
          print_char(out, r.hi, true);
        }
      }
      out += ']';
      return;
    }
    case ExprKind::seq:
    case ExprKind::alt:
    case ExprKind::intersect: {
      const bool paren = nested && e->kind != ExprKind::seq;
      const char* sep = e->kind == ExprKind::seq ? " " : e->kind == ExprKind::alt ? " | " : " & ";
      if (paren || (nested && e->kind == ExprKind::seq)) out += "(";
      for (size_t i = 0; i < e->items.size(); ++i) {
        if (i > 0) out += sep;
        print(g, e->items[i], out, true);
      }
      if (paren || (nested && e->kind == ExprKind::seq)) out += ")";
      return;
    }
    case ExprKind::repeat: {
      print(g, e->items[0], out, true);
      if (e->min == 0 && e->max == kUnbounded) {
        out += '*';
      } else if (e->min == 1 && e->max == kUnbounded) {
        out += '+';
      } else if (e->min == 0 && e->max == 1) {
        out += '?';
      } else if (e->max == kUnbounded) {
        out += fmt::format("{{{},}}", e->min);
      } else if (e->min == e->max) {
        out += fmt::format("{{{}}}", e->min);
      } else {
        out += fmt::format("{{{},{}}}", e->min, e->max);
      }
      return;
    }
    case ExprKind::ref:
      out += e->rule < g.names.size() ? g.names[e->rule] : fmt::format("rule-{}", e->rule);
      return;
    case ExprKind::token:
      out += fmt::format("{}<[{}]>", e->negated ? "!" : "", e->token);
      return;
  }
}

}  // namespace

std::string to_gbnf(const Grammar& g, const ExprPtr& e) {
  std::string out;
  print(g, e, out, false);
  return out;
}

std::string to_gbnf(const Grammar& g) {
  std::string out;
  for (size_t i = 0; i < g.rules.size(); ++i) {
    if (!g.rules[i]) continue;
    out += g.names[i] + " ::= " + to_gbnf(g, g.rules[i]) + "\n";
  }
  return out;
}

namespace {

ExprPtr remap(const ExprPtr& e, const std::vector<uint32_t>& map) {
  if (e->kind == ExprKind::ref) return ref(map[e->rule]);
  if (e->items.empty()) return e;
  auto copy = std::make_shared<Expr>(*e);
  for (auto& it : copy->items) it = remap(it, map);
  return copy;
}

}  // namespace

uint32_t import_rules(Grammar& dst, const Grammar& src, const std::string& prefix) {
  std::vector<uint32_t> map(src.size());
  for (size_t i = 0; i < src.size(); ++i) map[i] = dst.fresh_rule(prefix + src.names[i]);
  for (size_t i = 0; i < src.size(); ++i) dst.define(map[i], remap(src.rules[i], map));
  return map[src.root];
}

}  // namespace deltafin::grammar
