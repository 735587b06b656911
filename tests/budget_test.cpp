// Running under a memory budget: exact results when the budget forces expert evictions and
// trunk streaming every pass, peak RSS within the budget plus the stated fixed overhead, and a
// clear refusal below the minimum working set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "fixtures/synthetic.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "streaming_util.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

uint64_t minimum_budget(const std::string& dir, int64_t max_rows = 256) {
  auto c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions o;
  o.budget = 1ull << 40;
  o.shape.max_rows = max_rows;
  return plan_memory(c, *ck, o).min_working_set;
}

std::string kib(uint64_t bytes) {
  return std::to_string((bytes + 1023) / 1024) + "K";
}

TEST(Budget, StreamingIsExactAtTheMinimumBudget) {
  const std::string toks = "5,17,200,3,99,42,7,300,64,128,1,250,77,8,400,3,3,3,19,21";
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16"}) {
    const std::string m = test::data_dir() + "/" + name + "/model";
    const std::string budget = kib(minimum_budget(m));
    for (const char* mode : {"prefill", "decode", "split:7"}) {
      auto mm = test::cli_logits({"--mmap"}, m, toks, mode);
      // O_DIRECT for one mode (the aligned-read path), the page cache for the others (faster here).
      std::vector<std::string> extra = {"--memory-budget", budget, "-v"};
      if (std::string(mode) != "prefill") extra.push_back("--no-direct-io");
      auto st = test::cli_logits(extra, m, toks, mode);
      // Same kernels, same weights, same order: streaming changes where bytes come from only.
      EXPECT_EQ(mm, st) << name << " " << mode;
    }
    // At the minimum every trunk unit is streamed and the cache holds one pass's experts.
    auto r = test::run_deltafin({"logits", "--model", m, "--tokens", "1,2", "--out",
                                 test::temp_dir("p") + "/x", "--memory-budget", budget, "-v"});
    EXPECT_NE(r.err.find("0 of 10 units resident"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("= 4 experts"), std::string::npos) << r.err;
  }
}

TEST(Budget, GreedyGenerationIsUnchangedUnderABudget) {
  auto c = json::parse(test::slurp(test::data_dir() + "/k3-tiny-mxfp4/case.json"));
  std::string prompt;
  for (auto& t : c["greedy_prompt"]) {
    if (!prompt.empty()) prompt += ',';
    prompt += std::to_string(t.get<int>());
  }
  const std::string m = test::data_dir() + "/k3-tiny-mxfp4/model";
  auto r = test::run_deltafin({"run", "--json", "--model", m, "--prompt-ids", prompt, "--max-new",
                               "12", "--memory-budget", kib(minimum_budget(m))});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = json::parse(r.out);
  EXPECT_EQ(j["completion_ids"], c["greedy_continuation"]);
  EXPECT_GT(j["expert_misses"].get<int>(), 0);
  EXPECT_GT(j["bytes_read"].get<double>(), 0);
}

TEST(Budget, RefusedBelowTheMinimumWorkingSet) {
  const std::string m = test::data_dir() + "/k3-tiny-mxfp4/model";
  const std::string out = test::temp_dir("budget_refused") + "/logits.f32";
  auto r = test::run_deltafin(
      {"logits", "--model", m, "--tokens", "1", "--out", out, "--memory-budget", "1M"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("below the minimum working set of"), std::string::npos) << r.err;
}

TEST(Budget, PeakRssStaysWithinTheBudgetPlusFixedOverhead) {
  // A model several times the budget: 3 MoE layers x 64 experts of ~1.2 MB, trunk ~40 MB.
  SyntheticSpec s = synthetic_preset("tiny");
  s.hidden = 1024;
  s.layers = 4;
  s.experts = 64;
  s.top_k = 8;
  s.moe_intermediate = 384;
  s.latent = 1024;
  s.dense_intermediate = 2048;
  s.vocab = 4096;
  s.kda_heads = 8;
  s.kda_head_dim = 64;
  s.mla_heads = 8;
  s.shard_bytes = 64ull << 20;
  std::string dir = test::temp_dir("rss") + "/model";
  make_model(dir, s);
  const uint64_t min = minimum_budget(dir, 16);
  const uint64_t budget = min + (24ull << 20);
  auto r = test::run_deltafin({"run", "--json", "--model", dir, "--prompt-ids", "1,2,3,4,5,6,7,8",
                               "--max-new", "8", "--prefill-chunk", "16", "--memory-budget",
                               kib(budget)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = json::parse(r.out);
  const double rss = j["peak_rss_bytes"];
  EXPECT_LE(rss, static_cast<double>(budget + kFixedOverheadBytes)) << "budget " << budget;
  EXPECT_GT(j["bytes_read"].get<double>(), 0);  // experts were streamed
}

}  // namespace
}  // namespace deltafin
