// `--draft DIR` on the surfaces: a draft model folder (the golden EAGLE-3 case as released, and
// synthetic EAGLE-3.1 and DSpark folders written by `make-model --drafter`) drives `run` through
// the real binary, `chat` across turns and `serve --parallel 4` with concurrent clients, and the
// completion is plain greedy decoding's, token for token, with drafts actually proposed and
// verified. A folder that is not a draft model gets one clear line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "draft/draft_model.h"
#include "model/config.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

std::string target_dir() {
  return test::data_dir() + "/k3-tiny-mxfp4/model";
}

json run_json(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"run",       "--json",     "--threads",    "1",
                                   "--model",   target_dir(), "--prompt-ids", "5,6,7,8,9,10,11,12",
                                   "--max-new", "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = test::run_deltafin(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json::object();
}

// A synthetic draft folder of `kind` for `target`, written by the binary.
std::string draft_for(const std::string& target, const std::string& kind) {
  const std::string out = test::temp_dir("draft_surfaces_" + kind) + "/draft";
  auto r =
      test::run_deltafin({"make-model", out, "--drafter", kind, "--target", target, "--quiet"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

TEST(DraftSurfaces, RunWithADraftModelFolderKeepsTheGreedyOutput) {
  const json plain = run_json({});
  ASSERT_EQ(plain["completion_ids"].size(), 16u);
  const std::vector<std::string> folders = {test::data_dir() + "/eagle3-tiny/model",
                                            draft_for(target_dir(), "eagle3.1"),
                                            draft_for(target_dir(), "dspark")};
  for (const auto& dir : folders) {
    for (const std::string k : {"4", "auto"}) {
      const json j = run_json({"--draft", dir, "--draft-max", k});
      EXPECT_EQ(j["completion_ids"], plain["completion_ids"]) << dir << " --draft-max " << k;
      if (k == "4") {
        EXPECT_GT(j["draft_proposed"].get<int>(), 0) << dir;
        EXPECT_GT(j["target_passes"].get<int>(), 0) << dir;
      }
    }
  }
}

TEST(DraftSurfaces, ChatAndServeWithADraftModelFolderKeepTheOutput) {
  const std::string& model = test::server_model_dir();
  const std::string draft = draft_for(model, "eagle3.1");
  const std::string turns = "Hello there\nTell me more\nAnd again\n";
  const std::vector<std::string> base = {"chat",      "--model", model,        "--threads", "1",
                                         "--max-new", "16",      "--no-color", "--stats"};
  auto plain = test::run_deltafin(base, turns);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto args = base;
  args.insert(args.end(), {"--draft", draft, "--draft-max", "3"});
  auto drafted = test::run_deltafin(args, turns);
  ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
  EXPECT_EQ(drafted.out, plain.out);

  const std::vector<std::string> prompts = {"72,101,108,108,111", "84,104,101,32,99,97,116",
                                            "79,110,99,101,32,117,112", "65,32,98,105,114,100"};
  std::vector<json> plain_texts, drafted_texts;
  {
    test::ServerProcess srv({"--parallel", "4", "--threads", "1"}, model);
    ASSERT_TRUE(srv.ready()) << srv.err();
    plain_texts = test::concurrent_completions(srv, prompts, 16);
  }
  test::ServerProcess srv(
      {"--parallel", "4", "--threads", "1", "--draft", draft, "--draft-max", "3"}, model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  drafted_texts = test::concurrent_completions(srv, prompts, 16);
  int64_t proposed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(plain_texts[i].contains("choices")) << plain_texts[i].dump();
    ASSERT_TRUE(drafted_texts[i].contains("choices")) << drafted_texts[i].dump();
    EXPECT_EQ(drafted_texts[i]["choices"][0]["text"], plain_texts[i]["choices"][0]["text"]) << i;
    proposed += drafted_texts[i]["timings"].value("draft_n", int64_t{0});
  }
  EXPECT_GT(proposed, 0);
}

// The draft model's weights and its cache are counted in the memory plan before anything loads,
// on every surface, and -v prints them: the [plan] line carries the bytes the opened drafter binds
// and its cache for the planned context and sequences, and a "draft:" line describes it.
TEST(DraftSurfaces, EverySurfaceCountsTheDraftModelInTheMemoryPlan) {
  const std::string& model = test::server_model_dir();
  const ModelConfig cfg = load_config(model);
  for (const std::string kind : {"eagle3.1", "dspark"}) {
    const std::string draft = draft_for(model, kind);
    const auto dm = open_draft_model(draft, cfg);
    ASSERT_GT(dm->weight_bytes(), 0u);
    auto want = [&](int sequences) {
      return "draft model " + gib(dm->weight_bytes()) + " + its cache " +
             gib(dm->cache_bytes_per_position() * 256 * static_cast<uint64_t>(sequences));
    };
    const std::vector<std::string> common = {"--model", model,     "--threads", "1", "--ctx",
                                             "256",     "--draft", draft,       "-v"};
    auto with = [&](std::vector<std::string> args) {
      args.insert(args.end(), common.begin(), common.end());
      return args;
    };
    const auto run = test::run_deltafin(with({"run", "--prompt-ids", "5,6,7", "--max-new", "2"}));
    const auto chat = test::run_deltafin(with({"chat", "--max-new", "2", "--no-color"}), "Hi\n");
    const auto bench = test::run_deltafin(with(
        {"bench", "--prompt-tokens", "4", "--gen-tokens", "2", "--reps", "1", "--no-disk-probe"}));
    for (const auto* r : {&run, &chat, &bench}) {
      ASSERT_EQ(r->exit_code, 0) << kind << ": " << r->err;
      EXPECT_NE(r->err.find(want(1)), std::string::npos) << kind << ": " << r->err;
      EXPECT_NE(r->err.find("draft: " + dm->describe()), std::string::npos) << r->err;
    }
    test::ServerProcess srv({"--parallel", "2", "--threads", "1", "--ctx", "256", "--draft", draft,
                             "--draft-max", "3", "-v"},
                            model);
    ASSERT_TRUE(srv.ready()) << srv.err();
    EXPECT_NE(srv.err().find("draft model " + gib(dm->weight_bytes()) + " + its cache "),
              std::string::npos)
        << srv.err();
  }
}

TEST(DraftSurfaces, AFolderThatIsNotADraftModelGetsOneLine) {
  const std::string empty = test::temp_dir("draft_surfaces_empty");
  auto r = test::run_deltafin({"run", "--model", target_dir(), "--prompt-ids", "5,6,7", "--max-new",
                               "2", "--draft", empty});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no config.json"), std::string::npos) << r.err;
  // Issue 31 B8: the flag is named once ("--draft: --draft DIR: ..." before).
  EXPECT_NE(r.err.find("--draft: " + empty + ": no config.json"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--draft: --draft"), std::string::npos) << r.err;
  // A folder with a config that does not fit the target: the drafter's own check names it.
  auto bad = test::run_deltafin({"run", "--model", target_dir(), "--prompt-ids", "5,6,7",
                                 "--max-new", "2", "--draft", target_dir()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(bad.err.find("terminate"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace deltafin
