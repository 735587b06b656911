// Settings keep their names per front end: the layers below the front ends call a setting by
// plain words ("memory budget", SettingError) and never by a CLI flag, and each front end words
// the same refusal in its own terms — the CLI with its flag, the C API (and so Python) with the
// parameter field.
#include <deltafin/deltafin.h>
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;

// The string literals of one line of C++ outside a // comment (enough for this code base: no
// raw strings in these layers, no quotes inside comments before code).
std::vector<std::string> literals(const std::string& line) {
  std::vector<std::string> out;
  const size_t comment = line.find("//");
  static const std::regex lit(R"re("((?:[^"\\]|\\.)*)")re");
  for (std::sregex_iterator it(line.begin(), line.end(), lit), end; it != end; ++it) {
    if (comment != std::string::npos && static_cast<size_t>(it->position()) > comment) break;
    out.push_back((*it)[1]);
  }
  return out;
}

TEST(Settings, LayersBelowTheFrontEndsNameNoFlag) {
  const fs::path src = fs::path(test::data_dir()) / ".." / ".." / "src";
  // Every layer but the two front ends whose own terms are flags: the CLI and `deltafin serve`'s
  // server (its messages name its own options). The C API is a front end without flags.
  const std::vector<std::string> layers = {"core",      "tensor", "kernels",  "gpu",
                                           "tokenizer", "model",  "storage",  "engine",
                                           "generate",  "draft",  "fixtures", "capi"};
  const std::regex flag(R"((^|[^A-Za-z0-9-])--[a-z])");
  int files = 0;
  for (const auto& layer : layers) {
    if (!fs::exists(src / layer)) continue;
    for (const auto& e : fs::recursive_directory_iterator(src / layer)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h") continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        for (const auto& s : literals(line)) {
          EXPECT_FALSE(std::regex_search(s, flag))
              << e.path().lexically_relative(src).string() << ":" << n << " names a CLI flag in \""
              << s << "\": name the setting in words and let the front end word it";
        }
      }
    }
  }
  EXPECT_GT(files, 50);
}

TEST(Settings, ASettingErrorIsWordedByEachFrontEnd) {
  const SettingError e("memory budget", "1G", "below the minimum");
  EXPECT_STREQ(e.what(), "memory budget 1G: below the minimum");
  EXPECT_EQ(e.worded("--memory-budget"), "--memory-budget 1G: below the minimum");
  EXPECT_EQ(SettingError("trunk", "", "x").worded("trunk"), "trunk: x");
  try {
    fail_setting("draft max", "0", "must be at least {}", 1);
  } catch (const InvalidArgument& caught) {  // a SettingError is an argument error everywhere
    EXPECT_STREQ(caught.what(), "draft max 0: must be at least 1");
  }
}

// The same budget refusal from the plan: the CLI names --memory-budget, the C API memory_budget.
TEST(Settings, TheBudgetRefusalNamesEachFrontEndsSetting) {
  const std::string m = test::data_dir() + "/k3-tiny-mxfp4/model";
  auto r = test::run_deltafin({"logits", "--model", m, "--tokens", "1", "--out",
                               test::temp_dir("settings") + "/l.f32", "--memory-budget", "1M"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("deltafin: --memory-budget ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("below the minimum working set"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise the memory budget"), std::string::npos) << r.err;

  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.memory_budget = 1 << 20;
  deltafin_model* model = nullptr;
  EXPECT_EQ(deltafin_model_load(m.c_str(), &p, &model), DELTAFIN_ERR_ARGUMENT);
  const std::string err = deltafin_last_error();
  EXPECT_EQ(err.rfind("memory_budget ", 0), 0u) << err;
  EXPECT_EQ(err.find("--"), std::string::npos) << err;
  EXPECT_EQ(model, nullptr);
}

// A flag validator's refusal names the flag once (CLI11 puts it first), not twice.
TEST(Settings, AFlagValueRefusalNamesTheFlagOnce) {
  const std::string m = test::data_dir() + "/k3-tiny-mxfp4/model";
  const std::string not_a_drafter = test::temp_dir("settings_draft");
  for (const auto& [flag, value, problem] : std::vector<std::array<std::string, 3>>{
           {"--draft-max", "many", "expected auto or a number of drafts"},
           {"--draft", not_a_drafter, "no config.json"},
           {"--draft", "eagle", "unknown drafter"}}) {
    auto r = test::run_deltafin({"run", "--model", m, "--prompt-ids", "1,2", flag, value});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(flag + ": " + value + ": " + problem), std::string::npos) << r.err;
    size_t count = 0;
    for (size_t at = r.err.find(flag + ' '); at != std::string::npos;
         at = r.err.find(flag + ' ', at + 1))
      ++count;
    for (size_t at = r.err.find(flag + ':'); at != std::string::npos;
         at = r.err.find(flag + ':', at + 1))
      ++count;
    EXPECT_EQ(count, 1u) << r.err;
  }
}

}  // namespace
}  // namespace deltafin
