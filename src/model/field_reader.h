// Reading a config.json field by field: the target's config (config.cpp) and the draft models'
// (src/draft) share it, so every config error has the same shape — the field's full name, what
// was expected and what was found — and one error lists every problem at once.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace deltafin {

// The largest value each integer field may take: far above any K3-family model, far below what
// would exhaust memory. Fields not listed are sizes bounded by kMaxConfigDim.
inline constexpr int64_t kMaxConfigDim = int64_t{1} << 20;
inline int64_t config_field_bound(const char* key) {
  static const std::map<std::string, int64_t> bounds = {
      {"num_hidden_layers", 4096},
      {"first_k_dense_replace", 4096},
      {"vocab_size", int64_t{1} << 24},
      {"draft_vocab_size", int64_t{1} << 24},
      {"bos_token_id", int64_t{1} << 24},
      {"eos_token_id", int64_t{1} << 24},
      {"pad_token_id", int64_t{1} << 24},
      {"mask_token_id", int64_t{1} << 24},
      {"max_position_embeddings", int64_t{1} << 26},
      {"model_max_length", int64_t{1} << 26},
      {"short_conv_kernel_size", 64},
      {"num_attention_heads", 4096},
      {"num_heads", 4096},
      {"num_experts_per_token", 4096},
  };
  const auto it = bounds.find(key);
  return it == bounds.end() ? kMaxConfigDim : it->second;
}

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
    return checked(key, *v, min_value);
  }

  // A token id: an integer, or a list of them as Hugging Face configs write several end ids
  // (the first is the one the model emits; all of them stop generation).
  std::vector<int64_t> token_ids(const char* key, const nlohmann::json* fallback) {
    const nlohmann::json* v = find(key);
    if (v == nullptr || v->is_null()) v = fallback;
    if (v == nullptr || v->is_null()) return {-1};
    if (!v->is_array()) return {checked(key, *v, 0)};
    if (v->empty() || v->size() > 16) {
      problem(fmt::format("{}: expected a token id or a list of 1 to 16 token ids, found {}",
                          name(key), v->dump()));
      return {-1};
    }
    std::vector<int64_t> out;
    for (const auto& e : *v) out.push_back(checked(key, e, 0));
    return out;
  }

  // A value within [min_value, the field's bound]: absurd sizes (10^9 layers) are refused here,
  // before anything is allocated from them.
  int64_t checked(const char* key, const nlohmann::json& v, int64_t min_value) {
    const int64_t max_value = config_field_bound(key);
    if (!v.is_number_integer()) {
      problem(fmt::format("{}: expected an integer, found {}", name(key), v.dump().substr(0, 80)));
      return min_value;
    }
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}
                          ? INT64_MAX
                          : v.get<int64_t>();
    if (x < min_value || x > max_value) {
      problem(fmt::format("{}: expected an integer from {} to {}, found {}", name(key), min_value,
                          max_value, v.dump()));
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
      // Full width: an unsigned value beyond int64 saturates (and fails any range check).
      out.push_back(e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{INT64_MAX}
                        ? INT64_MAX
                        : e.get<int64_t>());
    }
    return out;
  }

 private:
  const nlohmann::json& obj_;
  std::string prefix_;
  std::vector<std::string>& problems_;
};

}  // namespace deltafin
