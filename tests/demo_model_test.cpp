// Cross-check of the engine on trained weights: the built-in demo checkpoint was trained and
// exported by tools/train (an independent PyTorch implementation of K3), which also recorded
// its own float64 perplexity of a held-out text and its greedy continuations of several prompts
// (tests/data/k3-demo/expected.json, written by tools/train/crosscheck.py). Two independent
// implementations agreeing on a trained model is the strongest check short of real K3 weights;
// the figures are stored, so this test needs no PyTorch.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

// Installs the demo into a fresh cache once per process and returns its folder.
const std::string& demo_dir() {
  static const std::string dir = [] {
    const std::string cache = test::temp_dir("democross");
    setenv("DELTAFIN_CACHE", cache.c_str(), 1);
    unsetenv("DELTAFIN_MODEL");
    auto r = test::run_deltafin({"run", "--prompt", "A", "--max-new", "1"});
    unsetenv("DELTAFIN_CACHE");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return cache + "/demo-k3-english";
  }();
  return dir;
}

json expected() {
  return json::parse(test::slurp(test::data_dir() + "/k3-demo/expected.json"));
}

TEST(DemoModel, PerplexityMatchesThePyTorchImplementation) {
  const json e = expected();
  auto r = test::run_deltafin({"perplexity", "--model", demo_dir(), "--file",
                               test::data_dir() + "/k3-demo/" + e["heldout"].get<std::string>(),
                               "--window", std::to_string(e["window"].get<int>()), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tokens"], e["tokens"]);  // the engine's tokenizer reads the text the same way
  const double want = e["perplexity"].get<double>();
  EXPECT_NEAR(j["perplexity"].get<double>(), want, 0.005 * want) << r.out;
}

TEST(DemoModel, GreedyContinuationsMatchThePyTorchImplementation) {
  const json e = expected();
  ASSERT_GE(e["greedy"].size(), 3u);
  for (const auto& c : e["greedy"]) {
    std::string ids;
    for (const auto& t : c["prompt_ids"]) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(t.get<int>());
    }
    auto r = test::run_deltafin({"run", "--model", demo_dir(), "--prompt-ids", ids, "--max-new",
                                 std::to_string(c["completion_ids"].size()), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["completion_ids"], c["completion_ids"]) << c["prompt"];
  }
}

}  // namespace
}  // namespace deltafin
