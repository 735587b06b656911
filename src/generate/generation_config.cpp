// generation_config.json (see generation_config.h), read with the config's field reader so its
// errors have the same shape: the file, the field, what was expected and what was found.
#include "generate/generation_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "model/field_reader.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

void GenerationDefaults::apply(SamplingParams& s) const {
  if (temperature) s.temperature = *temperature;
  if (top_k) s.top_k = *top_k;
  if (top_p) s.top_p = *top_p;
  if (min_p) s.min_p = *min_p;
  if (repetition_penalty) s.repetition_penalty = *repetition_penalty;
}

namespace {

// A number field within [lo, hi] (`open_lo`: lo itself excluded), or nothing when absent.
std::optional<float> ranged(FieldReader& r, const char* key, double lo, double hi, bool open_lo,
                            const char* expected) {
  const nlohmann::json* v = r.find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  const double x = r.number(key);
  if (!v->is_number()) return std::nullopt;  // the reader named it
  const bool ok = std::isfinite(x) && (open_lo ? x > lo : x >= lo) && x <= hi;
  if (!ok) r.problem(fmt::format("{}: expected {}, found {}", r.name(key), expected, v->dump()));
  return ok ? std::optional<float>(static_cast<float>(x)) : std::nullopt;
}

}  // namespace

GenerationDefaults parse_generation_config(const std::string& text, const std::string& path) {
  nlohmann::json j;
  check_json_depth(text, kMaxJsonDepth, path);
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, json_error_text(e));
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  GenerationDefaults g;
  g.path = path;
  std::vector<std::string> problems;
  FieldReader r(j, "", problems);
  // The ranges the server accepts for the same request fields.
  g.temperature = ranged(r, "temperature", 0, 2, false, "a number from 0 to 2");
  g.top_p = ranged(r, "top_p", 0, 1, true, "a number > 0 and <= 1");
  g.min_p = ranged(r, "min_p", 0, 1, false, "a number from 0 to 1");
  g.repetition_penalty =
      ranged(r, "repetition_penalty", 0.01, 100, false, "a number from 0.01 to 100");
  if (r.find("top_k") != nullptr && !r.find("top_k")->is_null()) {
    // Hugging Face's "off" is 0 or absent; vLLM's is -1: both mean no top-k here.
    const int64_t k = r.checked("top_k", *r.find("top_k"), -1);
    g.top_k = static_cast<int>(std::max<int64_t>(k, 0));
  }
  if (r.find("eos_token_id") != nullptr) {
    g.eos_token_ids = r.token_ids("eos_token_id", nullptr);
    if (g.eos_token_ids == std::vector<int64_t>{-1}) g.eos_token_ids.clear();
  }
  if (!problems.empty()) fail("{}: {}", path, fmt::join(problems, "; "));
  return g;
}

GenerationDefaults load_generation_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  return parse_generation_config(read_regular_file(path), path);
}

std::vector<int32_t> stop_ids_for(const ModelConfig& c, const Tokenizer* tok,
                                  const GenerationDefaults& g) {
  std::vector<int32_t> ids;
  auto add = [&ids](int64_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(static_cast<int32_t>(id));
  };
  for (const int64_t id : c.eos_token_ids) add(id);
  for (const int64_t id : g.eos_token_ids) {
    if (id >= c.vocab)
      fail("{}: eos_token_id {} is outside the vocabulary ({})", g.path, id, c.vocab);
    add(id);
  }
  // The end-of-turn token by the name the model's own tokenizer gives it: K3's <|end_of_msg|>,
  // the K2 family's (Kimi-Linear, K2) <|im_end|> — the same slot under two names, so only the
  // tokenizer can say which it is.
  if (tok != nullptr) {
    for (const char* name : {"<|end_of_msg|>", "<|im_end|>"}) {
      if (auto eom = tok->special_id(name)) add(*eom);
    }
  }
  return ids;
}

}  // namespace deltafin
