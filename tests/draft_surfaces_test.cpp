// `--draft DIR` on the surfaces: a draft model folder (the golden EAGLE-3 case as released, and
// synthetic EAGLE-3.1 and DSpark folders written by `make-model --drafter`) drives `run` through
// the real binary, and the completion is plain greedy decoding's, token for token, with drafts
// actually proposed and verified. A folder that is not a draft model gets one clear line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

TEST(DraftSurfaces, RunWithADraftModelFolderKeepsTheGreedyOutput) {
  const json plain = run_json({});
  ASSERT_EQ(plain["completion_ids"].size(), 16u);
  const std::string root = test::temp_dir("draft_surfaces");
  std::vector<std::string> folders = {test::data_dir() + "/eagle3-tiny/model"};
  for (const std::string kind : {"eagle3.1", "dspark"}) {
    const std::string out = root + "/" + kind;
    auto r = test::run_deltafin(
        {"make-model", out, "--drafter", kind, "--target", target_dir(), "--quiet"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    folders.push_back(out);
  }
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

TEST(DraftSurfaces, AFolderThatIsNotADraftModelGetsOneLine) {
  const std::string empty = test::temp_dir("draft_surfaces_empty");
  auto r = test::run_deltafin({"run", "--model", target_dir(), "--prompt-ids", "5,6,7", "--max-new",
                               "2", "--draft", empty});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no config.json"), std::string::npos) << r.err;
  // A folder with a config that does not fit the target: the drafter's own check names it.
  auto bad = test::run_deltafin({"run", "--model", target_dir(), "--prompt-ids", "5,6,7",
                                 "--max-new", "2", "--draft", target_dir()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(bad.err.find("terminate"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace deltafin
