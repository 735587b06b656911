// What the streaming tests of every family share: the exact logits `deltafin logits` writes for
// a token list under some flags, and the check that a model streaming its experts under the
// plan's minimum budget computes the mapped run's logits and greedy tokens bit for bit; and the
// tiny model the trace and overlap tests stream, with the smallest budget its plan takes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fixtures/synthetic.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin::test {

// The tiny preset (made once per process) and the plan's minimum working set for 16-row passes
// and a 256-position context: under it experts and trunk are read every pass.
struct TinyStreamModel {
  std::string dir;
  uint64_t min_working_set = 0;
};
inline const TinyStreamModel& tiny_stream_model() {
  static const TinyStreamModel m = [] {
    TinyStreamModel t;
    t.dir = temp_dir("tinystream") + "/model";
    make_model(t.dir, synthetic_preset("tiny"));
    const ModelConfig c = load_config(t.dir);
    auto ck = Checkpoint::open(t.dir);
    PlanOptions o;
    o.budget = 1ull << 40;
    o.shape.max_rows = 16;
    o.context = 256;
    t.min_working_set = plan_memory(c, *ck, o).min_working_set;
    return t;
  }();
  return m;
}

// `deltafin logits --model MODEL --tokens TOKS --mode MODE EXTRA...`, read back as floats.
inline std::vector<float> cli_logits(const std::vector<std::string>& extra,
                                     const std::string& model, const std::string& toks,
                                     const std::string& mode) {
  const std::string out = temp_dir("cli_logits") + "/l.f32";
  std::vector<std::string> args = {"logits", "--model", model,   "--tokens", toks,
                                   "--mode", mode,      "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_deltafin(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string raw = slurp(out);
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

// The experts of the model in `dir` (stored as `format`) streamed under the plan's minimum
// working set: logits in prefill, decode and split modes and six greedy tokens equal the mapped
// run's, and the run really read experts. The slot is the engine's for an expert whose tensors
// lie apart (each widened to the 4 KiB grid).
inline void expect_minimum_budget_streaming_is_exact(const std::string& dir, ExpertFormat format) {
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions o;
  o.budget = 1ull << 40;
  o.shape.max_rows = 256;
  o.expert_slot_bytes = ExpertStore::slot_bytes_for(ExpertDirectory(c, *ck, format), c);
  const uint64_t min = plan_memory(c, *ck, o).min_working_set;
  const std::string budget = std::to_string((min + 1023) / 1024) + "K";
  const std::string toks = "5,17,200,3,99,42,7,300,64,128,1,250,77,8,400,3,3,3,19,21";
  for (const char* mode : {"prefill", "decode", "split:7"}) {
    const auto ram = cli_logits({"--mmap"}, dir, toks, mode);
    const auto streamed = cli_logits({"--memory-budget", budget}, dir, toks, mode);
    ASSERT_EQ(ram.size(), 20u * 512u);
    EXPECT_EQ(ram, streamed) << mode;  // where the bytes come from never shows
  }
  auto r = run_deltafin({"run", "--json", "--model", dir, "--prompt-ids", toks, "--max-new", "6",
                         "--memory-budget", budget});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["expert_misses"].get<int>(), 0);
  EXPECT_GT(j["bytes_read"].get<double>(), 0);  // experts were streamed
  r = run_deltafin(
      {"run", "--json", "--model", dir, "--prompt-ids", toks, "--max-new", "6", "--mmap"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["completion_ids"], j["completion_ids"]);
}

}  // namespace deltafin::test
