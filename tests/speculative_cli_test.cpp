// Speculative decoding through the real binary: `run`, `chat` across turns, `serve --parallel 4`
// with concurrent clients, and a `make-model --preset k3` model at the minimum expert-store
// budget must give the completion of plain decoding, token for token. Random-weight models do not
// repeat themselves, so the drafts come from the test aid `--draft replay[/N]:FILE` (the known
// continuation, every N-th draft wrong) to reach fully, partly and never accepted drafts.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "fixtures/synthetic.h"
#include "model/config.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

json run_json(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"run", "--json", "--threads", "1"};
  full.insert(full.end(), args.begin(), args.end());
  auto r = test::run_deltafin(full);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json::object();
}

std::string ids_text(const json& ids) {
  std::string s;
  for (const auto& t : ids) s += std::to_string(t.get<int>()) + " ";
  return s;
}

// The prompt + completion of a plain run, as a replay file.
std::string replay_file(const std::string& name, const json& plain) {
  const std::string f = test::temp_dir(name) + "/known.txt";
  test::spit(f, ids_text(plain["prompt_ids"]) + ids_text(plain["completion_ids"]));
  return f;
}

// Plain greedy vs replayed drafts (all right, every third wrong, all wrong) and ngram.
// `quick`: only --draft-max 4 (the slower models).
void expect_identical_runs(const std::string& model, const std::string& prompt,
                           const std::vector<std::string>& extra = {}, bool quick = false) {
  std::vector<std::string> base = {"--model", model, "--prompt-ids", prompt, "--max-new", "20"};
  base.insert(base.end(), extra.begin(), extra.end());
  const json plain = run_json(base);
  ASSERT_EQ(plain["completion_ids"].size(), 20u) << model;
  EXPECT_EQ(plain["draft_proposed"], 0);
  EXPECT_EQ(plain["tokens_per_pass"], 1.0);
  const std::string known = replay_file("replay", plain);
  for (const std::string spec : {"replay:", "replay/3:", "replay/1:"}) {
    for (const std::string k : {"4", "auto"}) {
      if (quick && k == "auto") continue;
      auto args = base;
      args.insert(args.end(), {"--draft", spec + known, "--draft-max", k});
      const json j = run_json(args);
      EXPECT_EQ(j["completion_ids"], plain["completion_ids"]) << model << " " << spec << " " << k;
      if (spec == "replay:" && k == "4") {
        EXPECT_GT(j["draft_accepted"].get<int>(), 0);
        EXPECT_EQ(j["draft_accepted"], j["draft_proposed"]);
        EXPECT_GT(j["tokens_per_pass"].get<double>(), 2.0);
        EXPECT_LT(j["target_passes"].get<int>(), 10);
      }
      if (spec == "replay/3:" && k == "4") {
        EXPECT_GT(j["draft_accepted"].get<int>(), 0);
        EXPECT_LT(j["draft_accepted"].get<int>(), j["draft_proposed"].get<int>());
      }
      if (spec == "replay/1:") {
        EXPECT_EQ(j["draft_accepted"], 0);
      }
      EXPECT_GE(j["bytes_per_token"].get<double>(), 0.0);
    }
  }
  if (quick) return;
  auto args = base;
  args.insert(args.end(), {"--draft", "ngram"});
  EXPECT_EQ(run_json(args)["completion_ids"], plain["completion_ids"]) << model << " ngram";
}

TEST(SpeculativeCli, RunIsIdenticalOnEveryGoldenModel) {
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16", "kimi-linear-tiny"}) {
    expect_identical_runs(test::data_dir() + "/" + name + "/model", "3,1,4,1,5,9,2,6");
  }
  // The DeepSeek-V3-architecture goldens: after the golden prompt K2's three stop at their
  // config's eos_token_id (2, the 5th greedy token), so they get a prompt that decodes 20 tokens.
  for (const char* name : {"k2-tiny", "k2-int4-tiny", "k25-tiny", "deepseek-v3-tiny"}) {
    expect_identical_runs(test::data_dir() + "/" + name + "/model", "11,4,9,4,9,4");
  }
}

TEST(SpeculativeCli, RunIsIdenticalOnAK3PresetModelAtTheMinimumBudget) {
  const std::string dir = test::temp_dir("speck3cli") + "/model";
  auto r = test::run_deltafin({"make-model", dir, "--preset", "k3", "--layers", "4", "--experts",
                               "16", "--top-k", "4", "--hidden", "256", "--vocab", "512", "--quiet",
                               "--no-tokenizer"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_identical_runs(dir, "11,4,9,4,9,4", {}, true);
  // The minimum working set for the rows a drafted pass may have (1 + 16 drafts).
  auto c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions po;
  po.budget = 1ull << 40;
  po.shape.max_rows = 256;
  const uint64_t min_budget = plan_memory(c, *ck, po).min_working_set;
  const std::string budget = std::to_string((min_budget + 1023) / 1024) + "K";
  expect_identical_runs(dir, "11,4,9,4,9,4", {"--memory-budget", budget}, true);
}

TEST(SpeculativeCli, BadDraftFlagsAreOneLineUsageErrors) {
  const std::string model = test::data_dir() + "/k3-tiny-mxfp4/model";
  for (const auto& [flag, value, needle] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--draft", "eagle", "unknown drafter"},
           {"--draft-max", "0", "at least 1"},
           {"--draft-max", "-2", "at least 1"},
           {"--draft-max", "many", "expected auto or a number"},
           {"--draft", "replay:/nonexistent/file", "cannot read"}}) {
    auto r = test::run_deltafin({"run", "--model", model, "--prompt-ids", "1,2", flag, value});
    EXPECT_EQ(r.exit_code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  for (const char* cmd : {"chat", "serve", "bench"}) {
    auto r = test::run_deltafin({cmd, "--model", model, "--draft", "eagle"});
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
  }
}

TEST(SpeculativeCli, ChatAcrossTurnsIsIdentical) {
  const std::string& model = test::server_model_dir();
  const std::string turns = "Hello there\nTell me more\nAnd again\n";
  const std::vector<std::string> base = {"chat",      "--model", model,        "--threads", "1",
                                         "--max-new", "24",      "--no-color", "--stats"};
  auto plain = test::run_deltafin(base, turns);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  // The known text: the plain answers, tokenized.
  const std::string text_file = test::temp_dir("chatreplay") + "/answers.txt";
  test::spit(text_file, plain.out);
  auto tok = test::run_deltafin({"tokenize", "--model", model, "--file", text_file});
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  const std::string known = test::temp_dir("chatreplay2") + "/known.txt";
  test::spit(known, tok.out);
  for (const std::string& spec :
       std::vector<std::string>{"replay:" + known, "replay/4:" + known, "ngram"}) {
    auto args = base;
    args.insert(args.end(), {"--draft", spec});
    auto r = test::run_deltafin(args, turns);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << spec;
    EXPECT_NE(r.err.find("tokens/pass"), std::string::npos);
  }
}

TEST(SpeculativeCli, ServeParallelWithConcurrentClientsIsIdentical) {
  const std::string& model = test::server_model_dir();
  const std::vector<std::string> prompts = {"72,101,108,108,111", "84,104,101,32,99,97,116",
                                            "79,110,99,101,32,117,112", "65,32,98,105,114,100"};
  // Plain greedy completions (the binary's run; the server gives the same ids), as known text.
  std::string known_ids;
  for (const auto& p : prompts) {
    const json j = run_json({"--model", model, "--prompt-ids", p, "--max-new", "24"});
    known_ids += ids_text(j["prompt_ids"]) + ids_text(j["completion_ids"]);
  }
  const std::string known = test::temp_dir("servereplay") + "/known.txt";
  test::spit(known, known_ids);
  std::vector<json> plain, drafted;
  {
    test::ServerProcess srv({"--parallel", "4", "--threads", "1"}, model);
    ASSERT_TRUE(srv.ready()) << srv.err();
    plain = test::concurrent_completions(srv, prompts, 24);
  }
  test::ServerProcess srv({"--parallel", "4", "--threads", "1", "--draft", "replay/3:" + known},
                          model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  drafted = test::concurrent_completions(srv, prompts, 24);
  int64_t accepted = 0, proposed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(plain[i].contains("choices")) << plain[i].dump();
    ASSERT_TRUE(drafted[i].contains("choices")) << drafted[i].dump();
    EXPECT_EQ(drafted[i]["choices"][0]["text"], plain[i]["choices"][0]["text"]) << i;
    EXPECT_FALSE(plain[i]["timings"].contains("draft_n"));
    const json& t = drafted[i]["timings"];
    ASSERT_TRUE(t.contains("draft_n")) << t.dump();
    proposed += t["draft_n"].get<int64_t>();
    accepted += t["draft_n_accepted"].get<int64_t>();
    EXPECT_GT(t["tokens_per_pass"].get<double>(), 1.0);
    EXPECT_LT(t["target_passes"].get<int64_t>(), 23);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, proposed);
  // The engine adds a step's counts to /metrics after it posted the step's tokens: poll.
  auto c = srv.client();
  const std::string want = "deltafin_draft_accepted_total " + std::to_string(accepted) + "\n";
  std::string body;
  for (int i = 0; i < 100 && body.find(want) == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    body = test::get(*c, "/metrics").body;
  }
  EXPECT_NE(body.find(want), std::string::npos) << body;
}

}  // namespace
}  // namespace deltafin
