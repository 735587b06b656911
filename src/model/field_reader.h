// Reading a config.json field by field: the target's config (config.cpp) and the draft models'
// (src/draft) share it, so every config error has the same shape — the field's full name, what
// was expected and what was found — and one error lists every problem at once.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace deltafin {

// Reads fields from one JSON object and collects every problem, so one error lists them all.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& obj, std::string prefix, std::vector<std::string>& problems)
      : obj_(obj), prefix_(std::move(prefix)), problems_(problems) {}

  const nlohmann::json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }
  void problem(const std::string& msg) { problems_.push_back(msg); }

  int64_t integer(const char* key, int64_t min_value, std::optional<int64_t> fallback = {}) {
    const nlohmann::json* v = find(key);
    if (v == nullptr || v->is_null()) {
      if (fallback) return *fallback;
      problem(fmt::format("{}: missing (expected an integer >= {})", name(key), min_value));
      return min_value;
    }
    if (!v->is_number_integer()) {
      problem(fmt::format("{}: expected an integer, found {}", name(key), v->dump()));
      return min_value;
    }
    int64_t x = v->get<int64_t>();
    if (x < min_value) {
      problem(fmt::format("{}: expected an integer >= {}, found {}", name(key), min_value, x));
      return min_value;
    }
    return x;
  }

  double number(const char* key, std::optional<double> fallback = {}) {
    const nlohmann::json* v = find(key);
    if (v == nullptr || v->is_null()) {
      if (fallback) return *fallback;
      problem(fmt::format("{}: missing (expected a number)", name(key)));
      return 0.0;
    }
    if (!v->is_number()) {
      problem(fmt::format("{}: expected a number, found {}", name(key), v->dump()));
      return 0.0;
    }
    return v->get<double>();
  }

  bool boolean(const char* key, std::optional<bool> fallback = {}) {
    const nlohmann::json* v = find(key);
    if (v == nullptr || v->is_null()) {
      if (fallback) return *fallback;
      problem(fmt::format("{}: missing (expected true or false)", name(key)));
      return false;
    }
    if (!v->is_boolean()) {
      problem(fmt::format("{}: expected true or false, found {}", name(key), v->dump()));
      return false;
    }
    return v->get<bool>();
  }

  std::string string(const char* key, std::optional<std::string> fallback = {}) {
    const nlohmann::json* v = find(key);
    if (v == nullptr || v->is_null()) {
      if (fallback) return *fallback;
      problem(fmt::format("{}: missing (expected a string)", name(key)));
      return {};
    }
    if (!v->is_string()) {
      problem(fmt::format("{}: expected a string, found {}", name(key), v->dump()));
      return {};
    }
    return v->get<std::string>();
  }

  void expect_string(const char* key, const std::string& want, bool required = true) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) {
      if (required) problem(fmt::format("{}: missing (expected \"{}\")", name(key), want));
      return;
    }
    if (!v->is_string() || v->get<std::string>() != want) {
      problem(
          fmt::format("{}: expected \"{}\", found {} (not supported)", name(key), want, v->dump()));
    }
  }

  std::vector<int64_t> int_list(const char* key,
                                const char* what = "a list of 1-based layer numbers") {
    const nlohmann::json* v = find(key);
    std::vector<int64_t> out;
    if (v == nullptr || !v->is_array()) {
      problem(fmt::format("{}: {} (expected {})", name(key),
                          v == nullptr ? "missing" : "found " + v->dump(), what));
      return out;
    }
    for (const auto& e : *v) {
      if (!e.is_number_integer()) {
        problem(fmt::format("{}: expected integers, found {}", name(key), e.dump()));
        return {};
      }
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  const nlohmann::json& obj_;
  std::string prefix_;
  std::vector<std::string>& problems_;
};

}  // namespace deltafin
