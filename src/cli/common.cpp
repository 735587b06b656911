#include "cli/common.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/synthetic.h"

namespace deltafin::cli {

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 0) return {};
        } catch (...) {
        }
        return "expected a whole number >= 0, found " + v;
      },
      "N>=0");
}

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 1) return {};
        } catch (...) {
        }
        return "expected a whole number >= 1, found " + v;
      },
      "N>=1");
}

void add_engine_options(CLI::App* cmd, EngineOptions& o, bool model_optional) {
  auto* m = cmd->add_option("--model", o.model, "Model folder (config.json + safetensors shards)");
  if (!model_optional) m->required();
  cmd->add_option("--threads", o.threads, "Compute threads (default: one per physical core)")
      ->check(non_negative());
  cmd->add_option("--kernels", o.kernels, "Force a kernel set: scalar, avx2, avx512 or neon (default: best for this CPU)");
}

void apply_engine_options(const EngineOptions& o) {
  set_global_threads(o.threads);
  if (!o.kernels.empty()) kernels::select(o.kernels.c_str());
}

std::unique_ptr<Model> load_model(const EngineOptions& o) {
  apply_engine_options(o);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(o.model, ec)) fail_arg("model folder {} (--model) does not exist", o.model);
  if (!fs::is_directory(o.model, ec)) fail_arg("--model {} is not a folder (expected a checkpoint folder)", o.model);
  return Model::load(o.model);
}

std::string cache_dir() {
  if (const char* d = std::getenv("DELTAFIN_CACHE"); d != nullptr && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) return std::string(x) + "/deltafin";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) return std::string(h) + "/.cache/deltafin";
  fail("cannot find a cache folder: set DELTAFIN_CACHE or HOME");
}

bool has_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::exists(fs::path(dir) / "tiktoken.model") && fs::exists(fs::path(dir) / "tokenizer_config.json");
}

std::string resolve_model_dir(const std::string& flag) {
  namespace fs = std::filesystem;
  auto checked = [](const std::string& dir, const char* from) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) fail_arg("model folder {} ({}) does not exist", dir, from);
    if (!fs::is_directory(dir, ec)) fail_arg("{} ({}) is not a folder (expected a checkpoint folder)", dir, from);
    return dir;
  };
  if (!flag.empty()) return checked(flag, "--model");
  if (const char* m = std::getenv("DELTAFIN_MODEL"); m != nullptr && *m) return checked(m, "DELTAFIN_MODEL");
  const fs::path demo = fs::path(cache_dir()) / "demo-tiny";
  if (!fs::exists(demo / "config.json")) {
    fs::create_directories(demo.parent_path());
    fs::remove_all(demo);  // a half-made folder from an interrupted first run
    SyntheticSpec spec = synthetic_preset("tiny");
    make_model(demo.string(), spec);
  }
  fmt::print(stderr,
             "note: no --model given, using the built-in demo at {}: a random-weight model with the "
             "real K3 architecture (its output is gibberish). For real weights, download "
             "moonshotai/Kimi-K3 and pass --model DIR or set DELTAFIN_MODEL.\n",
             demo.string());
  return demo.string();
}

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  auto skip = [&] {
    while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) != 0)) ++i;
  };
  skip();
  bool bracket = i < text.size() && text[i] == '[';
  if (bracket) ++i;
  skip();
  if (bracket && i < text.size() && text[i] == ']') {
    ++i;
    skip();
    if (i != text.size()) fail_arg("{}: unexpected text after ']'", what);
    return ids;
  }
  while (i < text.size()) {
    skip();
    size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) ++i;
    if (start == i) fail_arg("{}: expected a comma-separated list of token ids, found \"{}\"", what, text);
    long long v = std::stoll(text.substr(start, i - start));
    if (v > INT32_MAX) fail_arg("{}: token id {} is too large", what, v);
    ids.push_back(static_cast<int32_t>(v));
    skip();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (bracket && i < text.size() && text[i] == ']') {
      ++i;
      skip();
      if (i != text.size()) fail_arg("{}: unexpected text after ']'", what);
      return ids;
    }
    if (i < text.size()) fail_arg("{}: expected ',' after a token id in \"{}\"", what, text);
  }
  if (bracket) fail_arg("{}: missing ']'", what);
  if (ids.empty()) fail_arg("{}: no token ids given", what);
  return ids;
}

uint64_t parse_size(const std::string& text, const std::string& what) {
  std::string t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())) != 0) t.pop_back();
  if (t.empty()) fail_arg("{}: empty size", what);
  double mult = static_cast<double>(1ull << 30);  // bare number = GiB
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  if (last == 'B' && t.size() >= 2 && std::isalpha(static_cast<unsigned char>(t[t.size() - 2]))) {
    t.pop_back();
    last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  }
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    mult = last == 'K' ? 1024.0 : last == 'M' ? 1048576.0 : last == 'G' ? 1073741824.0 : 1099511627776.0;
    t.pop_back();
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (...) {
    used = 0;
  }
  if (used != t.size() || !(v > 0) || !std::isfinite(v)) {
    fail_arg("{}: \"{}\" is not a size (expected a positive number with an optional K, M, G or T "
             "suffix, powers of 1024; a bare number means GiB)", what, text);
  }
  return static_cast<uint64_t>(v * mult);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}

}  // namespace deltafin::cli
