// The registry of fuzz targets and the helpers they share (see fuzz_targets.h). Kept apart from
// the bodies so the libFuzzer front end and the regression test list the same targets.
#include "fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace deltafin::fuzz {

void safetensors(const uint8_t* data, size_t size);
void config(const uint8_t* data, size_t size);
void tokenizer_files(const uint8_t* data, size_t size);
void tokenizer(const uint8_t* data, size_t size);
void chat(const uint8_t* data, size_t size);
void request(const uint8_t* data, size_t size);
void http(const uint8_t* data, size_t size);
void gbnf(const uint8_t* data, size_t size);
void json_schema(const uint8_t* data, size_t size);
void schema_merge(const uint8_t* data, size_t size);
void hub_listing(const uint8_t* data, size_t size);
void image(const uint8_t* data, size_t size);
void media(const uint8_t* data, size_t size);

namespace {
const Target kTargets[] = {
    {"safetensors", safetensors},
    {"config", config},
    {"tokenizer_files", tokenizer_files},
    {"tokenizer", tokenizer},
    {"chat", chat},
    {"request", request},
    {"http", http},
    {"gbnf", gbnf},
    {"json_schema", json_schema},
    {"schema_merge", schema_merge},
    {"hub_listing", hub_listing},
    {"image", image},
    {"media", media},
};
}  // namespace

const Target* targets(size_t* count) {
  *count = sizeof kTargets / sizeof kTargets[0];
  return kTargets;
}

const Target* find_target(const std::string& name) {
  for (const Target& t : kTargets) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

void fuzz_check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::filesystem::path root = std::filesystem::temp_directory_path();
    if (const char* t = std::getenv("DELTAFIN_FUZZ_TMP"); t != nullptr && *t != 0) root = t;
    std::filesystem::create_directories(root);
    std::string tmpl = (root / "deltafin-fuzz-XXXXXX").string();
    fuzz_check(::mkdtemp(tmpl.data()) != nullptr, "cannot create the scratch folder");
    static std::string removed_at_exit;
    removed_at_exit = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removed_at_exit, ec);
    });
    return tmpl;
  }();
  return dir;
}

std::string test_data_dir() {
  return DELTAFIN_TEST_DATA;
}

}  // namespace deltafin::fuzz
