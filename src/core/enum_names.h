// An enum's printed names as one table, read both ways: name_of (value -> name) and value_of
// (name -> value). Where a type is both printed and parsed (safetensors dtypes, cache policies
// named by a flag) the two directions come from the same rows and cannot disagree, and a new
// enumerator is one row rather than a case in a switch and a branch in a parser. A value missing
// from its table prints "?" (the tests print every name they check, so that shows at once).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace deltafin {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E, size_t N>
constexpr const char* name_of(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& row : table) {
    if (row.value == value) return row.name;
  }
  return "?";
}

template <typename E, size_t N>
constexpr std::optional<E> value_of(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& row : table) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

}  // namespace deltafin
