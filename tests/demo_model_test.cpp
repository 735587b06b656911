// Cross-check of the engine on trained weights: the built-in demo checkpoint was trained and
// exported by tools/train (an independent PyTorch implementation of K3), which also recorded
// its own float64 perplexity of a held-out text and its greedy continuations of several prompts
// (tests/data/k3-demo/expected.json, written by tools/train/crosscheck.py). Two independent
// implementations agreeing on a trained model is the strongest check short of real K3 weights;
// the figures are stored, so this test needs no PyTorch. The demo ships a trained EAGLE-3.1
// drafter (draft/, tools/train/train_eagle.py) that decoding uses by default: its proposals
// match the PyTorch drafter's (tests/data/k3-demo/eagle-expected.json, crosscheck_eagle.py), and
// drafting with it keeps the greedy output while drafts are really accepted. Its vision tower
// is random (tools/demo_vision.sh): with no --model, `run --image` takes images, counted in the
// prompt as the engine's own plan sizes them, with or without the drafter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "engine/vision_encoder.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

const std::string& demo_dir() {
  return test::demo_model_dir();
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
                                 std::to_string(c["completion_ids"].size()), "--json",
                                 "--temperature", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The reference continues past an end of sequence; the engine stops there (the demo's
    // generation_config.json names [EOS] 1025 and <|end_of_msg|> 1026): compare up to it.
    json want = json::array();
    for (const auto& t : c["completion_ids"]) {
      want.push_back(t);
      if (t == 1025 || t == 1026) break;
    }
    EXPECT_EQ(json::parse(r.out)["completion_ids"], want) << c["prompt"];
  }
}

std::string join(const json& ids) {
  std::string s;
  for (const auto& t : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(t.get<int>());
  }
  return s;
}

TEST(DemoModel, DrafterProposalsMatchThePyTorchDrafter) {
  const json e = json::parse(test::slurp(test::data_dir() + "/k3-demo/eagle-expected.json"));
  ASSERT_GE(e["cases"].size(), 3u);
  for (const auto& c : e["cases"]) {
    auto r = test::run_deltafin({"propose", "--model", demo_dir(), "--draft", demo_dir() + "/draft",
                                 "--tokens", join(c["prefix"]), "--anchor",
                                 std::to_string(c["anchor"].get<int>()), "--drafts",
                                 std::to_string(e["drafts"].get<int>()), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["draft_ids"], c["draft_ids"]) << c["prompt"];
  }
}

TEST(DemoModel, DraftsWithItsDrafterByDefaultAndKeepsTheGreedyOutput) {
  int64_t accepted = 0;
  for (const std::string prompt : {"The king said unto", "Tell me a story.", "Love is"}) {
    // Greedy (the demo samples by default: its generation_config.json).
    const std::vector<std::string> base = {"run",           "--model",   demo_dir(), "--prompt",
                                           prompt,          "--max-new", "32",       "--json",
                                           "--temperature", "0"};
    auto plain = test::run_deltafin([&] {
      auto a = base;
      a.insert(a.end(), {"--draft", "none"});
      return a;
    }());
    auto drafted = test::run_deltafin(base);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
    const json p = json::parse(plain.out), d = json::parse(drafted.out);
    EXPECT_EQ(d["completion_ids"], p["completion_ids"]) << prompt;
    EXPECT_EQ(p["draft_proposed"], 0);
    EXPECT_GT(d["draft_proposed"].get<int64_t>(), 0) << prompt;
    accepted += d["draft_accepted"].get<int64_t>();
  }
  EXPECT_GT(accepted, 0);
}

int64_t demo_image_tokens(const std::string& file) {
  const std::string bytes = test::slurp(file);
  return VisionEncoder::open(demo_dir())
      ->plan(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
             file)
      .num_tokens;
}

TEST(DemoModel, TakesImagesWithNoModelGiven) {
  const std::string photo = test::data_dir() + "/vision/photo.jpg";  // 640x427: downscaled
  const std::string wide = test::data_dir() + "/vision/anim.gif";    // 9000x24: 64 patches a side
  const int64_t tokens = demo_image_tokens(photo) + demo_image_tokens(wide);
  // The demo's in_patch_limit (1,024 patches of 14x14) downscales it; the padding to whole
  // merged tokens adds a few (the release's limit would keep it whole: 368 tokens).
  EXPECT_LT(demo_image_tokens(photo), 320);
  setenv("DELTAFIN_CACHE", std::filesystem::path(demo_dir()).parent_path().c_str(), 1);
  unsetenv("DELTAFIN_MODEL");
  const std::vector<std::string> args = {"run",       "--image", photo,      "--image",
                                         wide,        "--chat",  "--prompt", "What is this?",
                                         "--max-new", "8",       "--json",   "--temperature",
                                         "0"};
  auto drafted = test::run_deltafin(args);
  auto plain = test::run_deltafin([&] {
    auto a = args;
    a.insert(a.end(), {"--draft", "none"});
    return a;
  }());
  auto bomb = test::run_deltafin(
      {"run", "--image", test::data_dir() + "/vision/hostile_bomb.png", "--prompt", "Hi"});
  unsetenv("DELTAFIN_CACHE");
  ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(drafted.err.find("using the built-in demo"), std::string::npos) << drafted.err;
  EXPECT_NE(drafted.err.find("vision tower and projector are random"), std::string::npos)
      << drafted.err;
  const json d = json::parse(drafted.out), p = json::parse(plain.out);
  ASSERT_EQ(d["prompt_images"].size(), 2u) << drafted.out;
  EXPECT_EQ(d["images"], 2);
  EXPECT_EQ(d["image_tokens"], tokens);
  EXPECT_EQ(d["images_encoded"], 2);
  EXPECT_FALSE(d["completion_ids"].empty());
  EXPECT_EQ(d["completion_ids"], p["completion_ids"]);  // drafting keeps the greedy output
  // A hostile image is refused naming the file.
  EXPECT_NE(bomb.exit_code, 0);
  EXPECT_NE(bomb.err.find("hostile_bomb.png"), std::string::npos) << bomb.err;
}

}  // namespace
}  // namespace deltafin
