// JSON numbers as grammar IR, with JSON Schema's bounds (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum) compiled into the digits: a bound is compared digit by digit, so every
// number the grammar allows is inside the range, exactly, for integers and decimals alike.
//
// Sizes: at most kMaxIntDigits digits before the point (no leading zeros) and kMaxFracDigits
// after it; an unbounded number may have an exponent of one or two digits, a bounded one none.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "grammar/ir.h"

namespace deltafin::grammar {

inline constexpr size_t kMaxIntDigits = 16;
inline constexpr size_t kMaxFracDigits = 16;

// A decimal value: sign, integer digits without leading zeros ("0" for none), fraction digits
// without trailing zeros.
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  bool is_zero() const { return integer == "0" && fraction.empty(); }
};

// The exact decimal of a JSON number (doubles by their shortest round-trip text).
Decimal to_decimal(const nlohmann::json& number);
// -1, 0, 1 as a is less than, equal to, greater than b.
int compare(const Decimal& a, const Decimal& b);

struct Bound {
  Decimal value;
  bool exclusive = false;
};

// JSON number text (no surrounding whitespace) of the values within the bounds; integers only
// when `integer`. Throws InvalidArgument naming `path` when a bound has more digits than the
// grammar's numbers can reach.
ExprPtr number_text(const std::optional<Bound>& lo, const std::optional<Bound>& hi, bool integer,
                    const std::string& path);

}  // namespace deltafin::grammar
