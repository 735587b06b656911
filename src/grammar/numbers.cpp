#include "grammar/numbers.h"

#include <fmt/format.h>

#include "core/error.h"

namespace deltafin::grammar {

namespace {

ExprPtr digits(char lo, char hi) {
  return chars({{static_cast<char32_t>(lo), static_cast<char32_t>(hi)}});
}
ExprPtr any_digits(uint32_t min, uint32_t max) {
  return repeat(digits('0', '9'), min, max);
}
const uint32_t kInt = static_cast<uint32_t>(kMaxIntDigits);
const uint32_t kFrac = static_cast<uint32_t>(kMaxFracDigits);

// Integer part: "0" or up to kMaxIntDigits digits without a leading zero.
ExprPtr any_int() {
  return alt({lit("0"), seq({digits('1', '9'), any_digits(0, kInt - 1)})});
}
ExprPtr any_frac() {
  return opt(seq({lit("."), any_digits(1, kFrac)}));
}
// Digit strings of length 1..max containing a nonzero digit: k zeros (k < max), the first
// nonzero digit, then up to max - k - 1 digits. (Written as the intersection of "1..max digits"
// with "a nonzero digit somewhere", its automaton tracked every split of the digits seen, and a
// schema with a decimal bound took over a second to compile.)
ExprPtr nonzero_digits(uint32_t max) {
  std::vector<ExprPtr> alts;
  for (uint32_t k = 0; k < max; ++k)
    alts.push_back(seq({repeat(lit("0"), k, k), digits('1', '9'), any_digits(0, max - k - 1)}));
  return alt(std::move(alts));
}

// Integer parts of the same length as a (no leading zero unless one digit) greater / less
// than a, from position i on.
ExprPtr same_len_gt(const std::string& a, size_t i) {
  if (i == a.size()) return nothing();
  const char d = a[i];
  const size_t rest = a.size() - i - 1;
  std::vector<ExprPtr> alts;
  if (d < '9')
    alts.push_back(seq({digits(static_cast<char>(d + 1), '9'),
                        any_digits(static_cast<uint32_t>(rest), static_cast<uint32_t>(rest))}));
  alts.push_back(seq({lit(std::string(1, d)), same_len_gt(a, i + 1)}));
  return alt(std::move(alts));
}
ExprPtr same_len_lt(const std::string& a, size_t i) {
  if (i == a.size()) return nothing();
  const char d = a[i];
  const char lo = (i == 0 && a.size() > 1) ? '1' : '0';
  const size_t rest = a.size() - i - 1;
  std::vector<ExprPtr> alts;
  if (d > lo)
    alts.push_back(seq({digits(lo, static_cast<char>(d - 1)),
                        any_digits(static_cast<uint32_t>(rest), static_cast<uint32_t>(rest))}));
  alts.push_back(seq({lit(std::string(1, d)), same_len_lt(a, i + 1)}));
  return alt(std::move(alts));
}

// Integer parts > a / < a.
ExprPtr int_gt(const std::string& a) {
  std::vector<ExprPtr> alts{same_len_gt(a, 0)};
  if (a.size() < kMaxIntDigits)
    alts.push_back(seq({digits('1', '9'), any_digits(static_cast<uint32_t>(a.size()), kInt - 1)}));
  return alt(std::move(alts));
}
ExprPtr int_lt(const std::string& a) {
  std::vector<ExprPtr> alts{same_len_lt(a, 0)};
  if (a.size() > 1) {
    alts.push_back(lit("0"));
    alts.push_back(seq({digits('1', '9'), any_digits(0, static_cast<uint32_t>(a.size() - 2))}));
  }
  return alt(std::move(alts));
}

// Fraction digits G (after the point, 1..kMaxFracDigits long) with 0.G >= 0.b (or >), from
// position i of b on; b has no trailing zeros.
ExprPtr frac_ge(const std::string& b, size_t i, bool strict) {
  const auto left = static_cast<uint32_t>(kMaxFracDigits - i);
  if (i == b.size()) return strict ? nonzero_digits(left) : any_digits(0, left);
  if (left == 0) return nothing();
  const char d = b[i];
  std::vector<ExprPtr> alts;
  if (d < '9')
    alts.push_back(seq({digits(static_cast<char>(d + 1), '9'), any_digits(0, left - 1)}));
  alts.push_back(seq({lit(std::string(1, d)), frac_ge(b, i + 1, strict)}));
  return alt(std::move(alts));
}
// 0.G <= 0.b (or <): G may stop early (then it is smaller, b having no trailing zeros).
ExprPtr frac_le(const std::string& b, size_t i, bool strict) {
  const auto left = static_cast<uint32_t>(kMaxFracDigits - i);
  if (i == b.size()) return strict ? nothing() : repeat(lit("0"), 0, left);
  if (left == 0) return empty();
  const char d = b[i];
  std::vector<ExprPtr> alts;
  if (i > 0) alts.push_back(empty());
  if (d > '0')
    alts.push_back(seq({digits('0', static_cast<char>(d - 1)), any_digits(0, left - 1)}));
  alts.push_back(seq({lit(std::string(1, d)), frac_le(b, i + 1, strict)}));
  return alt(std::move(alts));
}

// Magnitudes (unsigned number text) >= d (or >).
ExprPtr mag_ge(const Decimal& d, bool strict, bool integer) {
  if (integer) {
    const bool equal_ok = d.fraction.empty() && !strict;
    return alt({int_gt(d.integer), equal_ok ? lit(d.integer) : nothing()});
  }
  ExprPtr equal_int;
  if (d.fraction.empty()) {
    equal_int = strict ? seq({lit("."), nonzero_digits(kFrac)}) : any_frac();
  } else {
    equal_int = seq({lit("."), frac_ge(d.fraction, 0, strict)});
  }
  return alt({seq({int_gt(d.integer), any_frac()}), seq({lit(d.integer), equal_int})});
}

// Magnitudes <= d (or <).
ExprPtr mag_le(const Decimal& d, bool strict, bool integer) {
  if (integer) {
    const bool equal_ok = !d.fraction.empty() || !strict;
    return alt({int_lt(d.integer), equal_ok ? lit(d.integer) : nothing()});
  }
  ExprPtr equal_int;
  if (d.fraction.empty()) {
    equal_int = strict ? nothing() : opt(seq({lit("."), repeat(lit("0"), 1, kFrac)}));
  } else {
    equal_int = alt({empty(), seq({lit("."), frac_le(d.fraction, 0, strict)})});
  }
  return alt({seq({int_lt(d.integer), any_frac()}), seq({lit(d.integer), equal_int})});
}

ExprPtr any_magnitude(bool integer) {
  return integer ? any_int() : seq({any_int(), any_frac()});
}

void check_digits(const Decimal& d, const std::string& path) {
  if (d.integer.size() > kMaxIntDigits || d.fraction.size() > kMaxFracDigits)
    fail_arg(
        "{}: the bound {}{}{}{} has more digits than supported ({} before the point, {} after)",
        path, d.negative ? "-" : "", d.integer, d.fraction.empty() ? "" : ".", d.fraction,
        kMaxIntDigits, kMaxFracDigits);
}

Decimal negate(Decimal d) {
  if (!d.is_zero()) d.negative = !d.negative;
  return d;
}

}  // namespace

Decimal to_decimal(const nlohmann::json& v) {
  std::string text;
  if (v.is_number_integer()) {
    text = v.dump();
  } else {
    text = fmt::format("{}", v.get<double>());
  }
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') {
    d.negative = true;
    ++i;
  }
  std::string mant;
  int64_t point = -1;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') {
      point = static_cast<int64_t>(mant.size());
    } else {
      mant += text[i];
    }
  }
  if (point < 0) point = static_cast<int64_t>(mant.size());
  if (i < text.size()) point += std::stoll(text.substr(i + 1));
  // Digits mant with the point after `point` digits.
  if (point <= 0) {
    d.integer = "0";
    d.fraction = std::string(static_cast<size_t>(-point), '0') + mant;
  } else if (point >= static_cast<int64_t>(mant.size())) {
    d.integer = mant + std::string(static_cast<size_t>(point) - mant.size(), '0');
  } else {
    d.integer = mant.substr(0, static_cast<size_t>(point));
    d.fraction = mant.substr(static_cast<size_t>(point));
  }
  const size_t nz = d.integer.find_first_not_of('0');
  d.integer = nz == std::string::npos ? "0" : d.integer.substr(nz);
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  if (d.is_zero()) d.negative = false;
  return d;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int sign = a.negative ? -1 : 1;
  if (a.integer.size() != b.integer.size())
    return a.integer.size() < b.integer.size() ? -sign : sign;
  if (const int c = a.integer.compare(b.integer); c != 0) return c < 0 ? -sign : sign;
  if (const int c = a.fraction.compare(b.fraction); c != 0) return c < 0 ? -sign : sign;
  return 0;
}

ExprPtr number_text(const std::optional<Bound>& lo, const std::optional<Bound>& hi, bool integer,
                    const std::string& path) {
  if (!lo && !hi) {
    ExprPtr mant = seq({opt(lit("-")), any_magnitude(integer)});
    if (integer) return mant;
    return seq({mant, opt(seq({chars({{'e', 'e'}, {'E', 'E'}}),
                               opt(chars({{'+', '+'}, {'-', '-'}})), any_digits(1, 2)}))});
  }
  if (lo) check_digits(lo->value, path);
  if (hi) check_digits(hi->value, path);
  if (lo && hi) {
    const int c = compare(lo->value, hi->value);
    if (c > 0 || (c == 0 && (lo->exclusive || hi->exclusive)))
      fail_arg("{}: the range is empty (minimum above maximum)", path);
  }
  // Non-negative values: the text is the magnitude.
  std::vector<ExprPtr> parts;
  const bool hi_negative = hi && (hi->value.negative || (hi->value.is_zero() && hi->exclusive));
  if (!hi_negative) {
    ExprPtr e = any_magnitude(integer);
    if (lo && !lo->value.negative) e = intersect(e, mag_ge(lo->value, lo->exclusive, integer));
    if (hi) e = intersect(e, mag_le(hi->value, hi->exclusive, integer));
    parts.push_back(e);
  }
  // Negative values: "-" and a magnitude m > 0 with -m in range.
  const bool lo_nonneg = lo && !lo->value.negative;
  if (!lo_nonneg) {
    ExprPtr e = intersect(any_magnitude(integer), mag_ge(Decimal{}, true, integer));
    if (lo) e = intersect(e, mag_le(negate(lo->value), lo->exclusive, integer));
    if (hi && hi->value.negative)
      e = intersect(e, mag_ge(negate(hi->value), hi->exclusive, integer));
    parts.push_back(seq({lit("-"), e}));
  }
  return alt(std::move(parts));
}

}  // namespace deltafin::grammar
