// Drafting survives state reuse (issue 26, "Done when"), with the built-in demo model and its
// trained EAGLE-3.1 drafter (a test process's own cache unpacks it; no --model means the demo):
// `chat` drafts on every turn of a 4-turn session and after a /load from snapshots on disk,
// `serve` drafts on every turn of a conversation continued from snapshots, and `bench` drafts.
//
// What is comparable: a turn's drafts depend only on the tokens before it and the drafter's
// state over them. A turn that continues a kept state or a snapshot must therefore propose,
// accept and pass exactly as a fresh process that prefills the same tokens from scratch
// (--state-cache none): for `chat`, a new session that /loads the conversation saved before
// that turn (the prompt token counts are checked equal, so both decode after the same tokens);
// for `serve`, the same request to a server that keeps no snapshots. With a fixed --draft-max
// (not auto, which picks per pass from measured timings) the verified passes are deterministic.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>

#include "server_util.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

using json = nlohmann::ordered_json;

const std::vector<std::string> kTurns = {"Tell me a story.", "What happened next?", "And then?",
                                         "How did it end?"};

struct TurnStats {
  int64_t prompt = 0;  // prefilled + reused
  std::string drafts;  // "drafts P proposed / A accepted (R%); N target passes, T tokens/pass"
  int64_t proposed = 0;
};

// The per-turn [stats] of a chat session's stderr.
std::vector<TurnStats> turn_stats(const std::string& err) {
  std::vector<TurnStats> out;
  static const std::regex prefill(R"(\[stats\] prefill (\d+) tokens[^,\n]*(?:, (\d+) reused)?)");
  static const std::regex drafts(R"(\[stats\] (drafts (\d+) proposed [^\n]*tokens/pass))");
  std::smatch m;
  for (auto it = err.cbegin(); std::regex_search(it, err.cend(), m, prefill); it = m[0].second) {
    out.push_back({std::stoll(m[1]) + (m[2].matched ? std::stoll(m[2]) : 0), "", 0});
  }
  size_t i = 0;
  for (auto it = err.cbegin(); std::regex_search(it, err.cend(), m, drafts); it = m[0].second) {
    if (i < out.size()) {
      out[i].drafts = m[1];
      out[i].proposed = std::stoll(m[2]);
    }
    ++i;
  }
  EXPECT_EQ(i, out.size()) << err;
  return out;
}

// The demo's folder, unpacked into this process's cache by a first run.
const std::string& demo() {
  static const std::string dir = [] {
    EXPECT_EQ(run_deltafin({"run", "--prompt", "A", "--max-new", "1"}).exit_code, 0);
    return std::string(std::getenv("DELTAFIN_CACHE")) + "/demo-k3-english";
  }();
  return dir;
}

std::vector<std::string> chat_args(const std::string& states) {
  return {"chat",       "--model", demo(), "--draft-max",   "3", "--max-new",     "24",  "--stats",
          "--no-color", "--think", "off",  "--temperature", "0", "--state-cache", states};
}

TEST(ReuseDrafting, ChatDraftsEveryTurnAsAFreshRunDoes) {
  const std::string dir = temp_dir("reuse-chat-draft");
  std::string input;
  for (size_t k = 0; k < kTurns.size(); ++k) {
    input += kTurns[k] + "\n/save " + dir + "/after" + std::to_string(k + 1) + ".json\n";
  }
  auto session = run_deltafin(chat_args(dir + "/states"), input);
  ASSERT_EQ(session.exit_code, 0) << session.err;
  const auto turns = turn_stats(session.err);
  ASSERT_EQ(turns.size(), kTurns.size()) << session.err;
  EXPECT_EQ(session.err.find("warning"), std::string::npos) << session.err;
  for (size_t k = 0; k < turns.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    EXPECT_GT(turns[k].proposed, 0) << session.err;
    if (k == 0) continue;
    // Fresh: the conversation before this turn, loaded and prefilled whole, then the turn.
    const std::string before = dir + "/after" + std::to_string(k) + ".json";
    auto fresh = run_deltafin(chat_args("none"), "/load " + before + "\n" + kTurns[k] + "\n");
    ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
    const auto f = turn_stats(fresh.err);
    ASSERT_EQ(f.size(), 1u) << fresh.err;
    EXPECT_EQ(f[0].prompt, turns[k].prompt) << fresh.err;
    EXPECT_EQ(f[0].drafts, turns[k].drafts) << fresh.err << "\n" << session.err;
  }
  // A new session that /loads the conversation continues from the snapshots on disk, drafter
  // included, and its next turn drafts as the session's did.
  auto loaded = run_deltafin(chat_args(dir + "/states"),
                             "/load " + dir + "/after3.json\n" + kTurns[3] + "\n");
  ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
  const auto l = turn_stats(loaded.err);
  ASSERT_EQ(l.size(), 1u) << loaded.err;
  EXPECT_NE(loaded.err.find("reused"), std::string::npos) << loaded.err;
  EXPECT_EQ(l[0].drafts, turns[3].drafts) << loaded.err;
}

TEST(ReuseDrafting, ServeDraftsEveryTurnAsAFreshServerDoes) {
  ServerProcess srv({"--draft-max", "3", "--state-cache", temp_dir("reuse-serve-draft")}, demo());
  ASSERT_TRUE(srv.ready()) << srv.err();
  ServerProcess fresh({"--draft-max", "3", "--state-cache", "none"}, demo());
  ASSERT_TRUE(fresh.ready()) << fresh.err();
  auto c = srv.client();
  auto fc = fresh.client();
  json messages = json::array();
  for (size_t k = 0; k < kTurns.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    messages.push_back({{"role", "user"}, {"content", kTurns[k]}});
    const json body = {{"model", "kimi-k3"},
                       {"messages", messages},
                       {"max_tokens", 24},
                       {"temperature", 0},
                       {"thinking", false}};
    auto r = post_json(*c, "/v1/chat/completions", body);
    auto f = post_json(*fc, "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_EQ(f.status, 200) << f.body;
    if (k > 0) {
      EXPECT_GT(r.j["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r.body;
    }
    EXPECT_EQ(r.j["choices"][0]["message"]["content"], f.j["choices"][0]["message"]["content"]);
    const json& t = r.j["timings"];
    EXPECT_GT(t.value("draft_n", 0), 0) << r.body;
    for (const char* key : {"draft_n", "draft_n_accepted", "target_passes"})
      EXPECT_EQ(t.value(key, -1), f.j["timings"].value(key, -2)) << key << "\n" << r.body;
    messages.push_back(
        {{"role", "assistant"}, {"content", r.j["choices"][0]["message"]["content"]}});
  }
  EXPECT_EQ(srv.err().find("warning"), std::string::npos) << srv.err();
}

TEST(ReuseDrafting, BenchDraftsWithTheDemo) {
  auto r = run_deltafin({"bench", "--model", demo(), "--prompt-tokens", "32", "--gen-tokens", "16",
                         "--reps", "1", "--no-disk-probe", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(json::parse(r.out)["draft_proposed"].get<int64_t>(), 0) << r.out;
  auto t = run_deltafin({"bench", "--model", demo(), "--turns", "3", "--prompt-tokens", "32",
                         "--gen-tokens", "8", "--no-disk-probe", "--json"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const json report = json::parse(t.out);  // a range-for over parse(...)["turns"] would dangle
  for (const auto& turn : report["turns"]) {
    EXPECT_GT(turn["draft_proposed"].get<int64_t>(), 0) << t.out;
    if (turn["turn"] > 1) {
      EXPECT_GT(turn["restored_tokens"].get<int64_t>(), 0) << t.out;
    }
  }
}

}  // namespace
}  // namespace deltafin::test
