#include "grammar/strings.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deltafin::grammar {

namespace {

ExprPtr range(char32_t lo, char32_t hi) {
  return chars({{lo, hi}});
}
ExprPtr d(uint32_t n) {
  return repeat(range('0', '9'), n, n);
}
ExprPtr hex() {
  return chars({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
}

// 0000 excluded (not a year for every reader); leap years by the Gregorian rule.
ExprPtr year() {
  return alt({seq({range('1', '9'), d(3)}), seq({lit("0"), range('1', '9'), d(2)}),
              seq({lit("00"), range('1', '9'), d(1)}), seq({lit("000"), range('1', '9')})});
}
ExprPtr leap_year() {
  // Not a century: the last two digits divisible by 4; a century: the first two divisible by 4.
  ExprPtr last_two = alt({seq({chars({{'0', '0'}, {'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}),
                               chars({{'4', '4'}, {'8', '8'}})}),
                          seq({chars({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}), lit("0")}),
                          seq({chars({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}),
                               chars({{'2', '2'}, {'6', '6'}})})});
  ExprPtr century =
      seq({alt({seq({chars({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}),
                     chars({{'0', '0'}, {'4', '4'}, {'8', '8'}})}),
                seq({lit("0"), chars({{'4', '4'}, {'8', '8'}})}),
                seq({chars({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}),
                     chars({{'2', '2'}, {'6', '6'}})})}),
           lit("00")});
  return alt({seq({d(2), last_two}), century});
}
ExprPtr date() {
  ExprPtr day28 = alt(
      {seq({lit("0"), range('1', '9')}), seq({lit("1"), d(1)}), seq({lit("2"), range('0', '8')})});
  ExprPtr day30 = alt({day28, lit("29"), lit("30")});
  ExprPtr day31 = alt({day30, lit("31")});
  ExprPtr month_day =
      alt({seq({alt({lit("01"), lit("03"), lit("05"), lit("07"), lit("08"), lit("10"), lit("12")}),
                lit("-"), day31}),
           seq({alt({lit("04"), lit("06"), lit("09"), lit("11")}), lit("-"), day30}),
           seq({lit("02-"), day28})});
  return alt({seq({year(), lit("-"), month_day}), seq({leap_year(), lit("-02-29")})});
}
ExprPtr time() {
  ExprPtr hour = alt({seq({range('0', '1'), d(1)}), seq({lit("2"), range('0', '3')})});
  ExprPtr minute = seq({range('0', '5'), d(1)});
  ExprPtr zone = alt({chars({{'Z', 'Z'}, {'z', 'z'}}),
                      seq({chars({{'+', '+'}, {'-', '-'}}), hour, lit(":"), minute})});
  return seq({hour, lit(":"), minute, lit(":"), minute,
              opt(seq({lit("."), repeat(range('0', '9'), 1, 9)})), zone});
}
ExprPtr label() {
  ExprPtr alnum = chars({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}});
  return seq(
      {alnum,
       opt(seq({repeat(chars({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'-', '-'}}), 0, 30), alnum}))});
}
ExprPtr hostname() {
  return seq({label(), repeat(seq({lit("."), label()}), 0, 4)});
}
ExprPtr email() {
  ExprPtr atom = repeat(chars({{'0', '9'},
                               {'A', 'Z'},
                               {'a', 'z'},
                               {'!', '!'},
                               {'#', '\''},
                               {'*', '+'},
                               {'-', '-'},
                               {'/', '/'},
                               {'=', '='},
                               {'?', '?'},
                               {'^', '`'},
                               {'{', '~'}}),
                        1, 20);
  return seq({atom, repeat(seq({lit("."), atom}), 0, 2), lit("@"), label(),
              repeat(seq({lit("."), label()}), 1, 3)});
}
ExprPtr ipv4() {
  ExprPtr octet = alt({seq({lit("25"), range('0', '5')}), seq({lit("2"), range('0', '4'), d(1)}),
                       seq({lit("1"), d(2)}), seq({range('1', '9'), d(1)}), d(1)});
  return seq({octet, lit("."), octet, lit("."), octet, lit("."), octet});
}
ExprPtr uri() {
  // A practical subset of RFC 3986: http(s), a host, an optional port, path segments of
  // unreserved characters, an optional query of the same.
  ExprPtr unreserved =
      chars({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'-', '.'}, {'_', '_'}, {'~', '~'}});
  ExprPtr segment = repeat(unreserved, 0, 40);
  return seq(
      {lit("http"), opt(lit("s")), lit("://"), hostname(),
       opt(seq({lit(":"), range('1', '9'), repeat(range('0', '9'), 0, 4)})),
       repeat(seq({lit("/"), segment}), 0, 6),
       opt(seq(
           {lit("?"),
            repeat(seq({repeat(unreserved, 1, 20), lit("="), repeat(unreserved, 0, 20)}), 1, 1),
            repeat(seq({lit("&"), repeat(unreserved, 1, 20), lit("="), repeat(unreserved, 0, 20)}),
                   0, 4)}))});
}

}  // namespace

const std::vector<std::string>& supported_formats() {
  static const std::vector<std::string> f = {"date",  "time", "date-time", "uuid",
                                             "email", "ipv4", "hostname",  "uri"};
  return f;
}

ExprPtr format_text(const std::string& format, const std::string& path) {
  if (format == "date") return date();
  if (format == "time") return time();
  if (format == "date-time") return seq({date(), chars({{'T', 'T'}, {'t', 't'}}), time()});
  if (format == "uuid") {
    return seq({repeat(hex(), 8, 8), lit("-"), repeat(hex(), 4, 4), lit("-"), repeat(hex(), 4, 4),
                lit("-"), repeat(hex(), 4, 4), lit("-"), repeat(hex(), 12, 12)});
  }
  if (format == "email") return email();
  if (format == "ipv4") return ipv4();
  if (format == "hostname") return hostname();
  if (format == "uri") return uri();
  std::string list;
  for (const auto& f : supported_formats()) list += (list.empty() ? "" : ", ") + f;
  fail_arg("{}: format \"{}\" is not supported (supported: {})", path, format, list);
}

namespace {

std::string escape_of(char32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\t':
      return "\\t";
    case '\r':
      return "\\r";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return fmt::format("\\u{:04x}", static_cast<unsigned>(c));
  }
}

bool needs_escape(char32_t c) {
  return c == '"' || c == '\\' || c < 0x20;
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const auto dc = utf8::decode(s, i);
    const char32_t c = dc.status == utf8::Decoded::Status::ok ? dc.cp : 0xFFFD;
    if (needs_escape(c)) {
      out += escape_of(c);
    } else {
      utf8::append(out, c);
    }
    i += dc.len;
  }
  return out + "\"";
}

ExprPtr json_escaped(const ExprPtr& e) {
  switch (e->kind) {
    case ExprKind::empty:
    case ExprKind::nothing:
      return e;
    case ExprKind::bytes: {
      const std::string q = json_quote(e->bytes);
      return lit(std::string_view(q).substr(1, q.size() - 2));
    }
    case ExprKind::char_class: {
      std::vector<CharRange> plain;
      std::vector<ExprPtr> alts;
      for (const CharRange& r : e->char_ranges) {
        for (char32_t c = r.lo; c <= r.hi && c < 0x20; ++c) alts.push_back(lit(escape_of(c)));
        CharRange rest = r;
        if (rest.lo < 0x20) rest.lo = 0x20;
        if (rest.lo > rest.hi) continue;
        for (const char32_t special : {char32_t{'"'}, char32_t{'\\'}}) {
          if (rest.lo <= special && special <= rest.hi) {
            alts.push_back(lit(escape_of(special)));
            if (rest.lo < special) plain.push_back({rest.lo, special - 1});
            rest.lo = special + 1;
          }
        }
        if (rest.lo <= rest.hi) plain.push_back(rest);
      }
      alts.push_back(chars(std::move(plain)));
      return alt(std::move(alts));
    }
    case ExprKind::seq:
    case ExprKind::alt:
    case ExprKind::intersect: {
      std::vector<ExprPtr> items;
      for (const auto& it : e->items) items.push_back(json_escaped(it));
      if (e->kind == ExprKind::seq) return seq(std::move(items));
      if (e->kind == ExprKind::alt) return alt(std::move(items));
      return intersect(items[0], items[1]);
    }
    case ExprKind::repeat:
      return repeat(json_escaped(e->items[0]), e->min, e->max);
    case ExprKind::byte_class:
    case ExprKind::ref:
    case ExprKind::token:
      break;
  }
  fail("json_escaped: the decoded text must be made of characters");
}

ExprPtr json_char() {
  ExprPtr hex = chars({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
  // \uXXXX without the surrogates D800-DFFF: one escape, one character.
  ExprPtr u = alt(
      {seq({chars({{'0', '9'}, {'A', 'C'}, {'a', 'c'}, {'E', 'F'}, {'e', 'f'}}), hex, hex, hex}),
       seq({chars({{'D', 'D'}, {'d', 'd'}}), chars({{'0', '7'}}), hex, hex})});
  return alt({chars({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true),
              seq({lit("\\"), alt({chars({{'"', '"'},
                                          {'\\', '\\'},
                                          {'/', '/'},
                                          {'b', 'b'},
                                          {'f', 'f'},
                                          {'n', 'n'},
                                          {'r', 'r'},
                                          {'t', 't'}}),
                                   seq({lit("u"), u})})})});
}

}  // namespace deltafin::grammar
