// End-to-end tests of `deltafin run` and `deltafin chat` through the real binary.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures/synthetic.h"
#include "scoped_env.h"
#include "storage/checkpoint.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A tiny model with a tokenizer, made once per test process.
const std::string& tiny_with_tokenizer() {
  static const std::string dir = [] {
    std::string d = test::temp_dir("tinytok") + "/model";
    make_model(d, synthetic_preset("tiny"));
    return d;
  }();
  return dir;
}

json run_json(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"run", "--json"};
  full.insert(full.end(), args.begin(), args.end());
  auto r = test::run_deltafin(full);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

TEST(CliRun, GreedyReproducesTheGoldenContinuation) {
  auto c = json::parse(test::slurp(test::data_dir() + "/k3-tiny-mxfp4/case.json"));
  std::string prompt, expect;
  for (auto& t : c["greedy_prompt"]) {
    if (!prompt.empty()) prompt += ',';
    prompt += std::to_string(t.get<int>());
  }
  for (auto& t : c["greedy_continuation"]) {
    if (!expect.empty()) expect += ' ';
    expect += std::to_string(t.get<int>());
  }
  auto r = test::run_deltafin({"run", "--model", test::data_dir() + "/k3-tiny-mxfp4/model",
                               "--prompt-ids", prompt, "--max-new",
                               std::to_string(c["greedy_continuation"].size())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expect + "\n");
}

TEST(CliRun, SeededSamplingIsReproducible) {
  std::vector<std::string> a = {"--model",       tiny_with_tokenizer(),
                                "--prompt",      "Once upon a time",
                                "--max-new",     "12",
                                "--temperature", "0.9",
                                "--top-p",       "0.95",
                                "--top-k",       "50",
                                "--seed",        "42"};
  auto x = run_json(a), y = run_json(a);
  EXPECT_EQ(x["completion_ids"], y["completion_ids"]);
  EXPECT_EQ(x["seed"], 42);
  a.back() = "43";
  auto z = run_json(a);
  EXPECT_NE(x["completion_ids"], z["completion_ids"]);
  // Greedy is the default and needs no seed.
  auto g1 = run_json(
      {"--model", tiny_with_tokenizer(), "--prompt", "Once upon a time", "--max-new", "8"});
  auto g2 = run_json(
      {"--model", tiny_with_tokenizer(), "--prompt", "Once upon a time", "--max-new", "8"});
  EXPECT_EQ(g1["completion_ids"], g2["completion_ids"]);
}

TEST(CliRun, MaxNewAndJsonStatsAreConsistent) {
  auto j = run_json({"--model", tiny_with_tokenizer(), "--prompt", "Hello", "--max-new", "9"});
  for (const char* k :
       {"prompt_ids", "completion_ids", "text", "prompt_tokens", "completion_tokens", "prefill_s",
        "ttft_s", "decode_s", "decode_tokens_per_s", "s_per_token", "stop_reason", "draft_proposed",
        "draft_accepted", "expert_hits", "expert_misses", "bytes_read", "peak_rss_bytes"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["completion_tokens"], 9);
  EXPECT_EQ(j["completion_ids"].size(), 9u);
  EXPECT_EQ(j["stop_reason"], "length");
  EXPECT_EQ(j["prompt_tokens"], j["prompt_ids"].size());
  const double rate = j["decode_tokens_per_s"], el = j["decode_s"];
  EXPECT_NEAR(rate * el, 8.0, 0.01);  // decode excludes the first token
  EXPECT_NEAR(j["s_per_token"].get<double>() * rate, 1.0, 1e-6);
  EXPECT_GE(j["ttft_s"].get<double>(), j["prefill_s"].get<double>());
  EXPECT_GT(j["peak_rss_bytes"].get<double>(), 0);
  EXPECT_EQ(j["draft_proposed"], 0);
}

TEST(CliRun, StopStringEndsTheTextBeforeIt) {
  // Pick a stop string from the greedy output, then rerun with it.
  auto full = run_json(
      {"--model", tiny_with_tokenizer(), "--prompt-ids", "72,101,108,108,111", "--max-new", "40"});
  std::string text = full["text"];
  ASSERT_GE(text.size(), 12u);
  // Two whole characters from byte 6 on (the tiny model's bytes are mostly not UTF-8: raw
  // output shows them as U+FFFD, and specials not at all).
  size_t at = 6;
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  size_t end = at;
  for (int chars = 0; chars < 2 && end < text.size(); ++chars) {
    ++end;
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  }
  ASSERT_GT(end, at);
  std::string stop = text.substr(at, end - at);
  auto cut = run_json({"--model", tiny_with_tokenizer(), "--prompt-ids", "72,101,108,108,111",
                       "--max-new", "40", "--stop", stop});
  EXPECT_EQ(cut["stop_reason"], "stop_string");
  EXPECT_EQ(cut["text"], text.substr(0, text.find(stop)));
}

// Copies the tiny model and makes its LM head favour `target` wherever it favoured `winner`.
std::string model_that_emits(int winner, int target) {
  std::string dir = test::temp_dir("eos") + "/model";
  fs::copy(tiny_with_tokenizer(), dir, fs::copy_options::recursive);
  auto ck = Checkpoint::open(dir);
  const TensorInfo head = ck->get("language_model.lm_head.weight");  // a copy: ck is closed below
  const uint64_t row = head.nbytes / head.shape[0];
  std::string path = ck->shards()[head.shard].path();
  ck.reset();
  std::string bytes = test::slurp(path);
  std::string w = bytes.substr(head.offset + winner * row, row);
  // 4 x the winner's row (bf16: add 2 to the exponent of every non-zero element).
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, w.data() + i, 2);
    if ((h & 0x7fff) != 0) h = static_cast<uint16_t>(h + (2 << 7));
    std::memcpy(w.data() + i, &h, 2);
  }
  bytes.replace(head.offset + target * row, row, w);
  test::spit(path, bytes);
  return dir;
}

TEST(CliRun, StopsAtEndOfTurnAndEos) {
  auto first =
      run_json({"--model", tiny_with_tokenizer(), "--chat", "--prompt", "hi", "--max-new", "1"});
  const int winner = first["completion_ids"][0];
  const int eom = 256 + 2;  // <|end_of_msg|> in the synthetic tokenizer (K3's offset)
  auto dir = model_that_emits(winner, eom);
  auto chat = run_json({"--model", dir, "--chat", "--prompt", "hi", "--max-new", "20"});
  EXPECT_EQ(chat["stop_reason"], "end_of_turn");
  EXPECT_EQ(chat["completion_ids"].back(), eom);
  EXPECT_LT(chat["completion_tokens"].get<int>(), 20);
  // Raw completion stops at the config's eos_token_id (here <|end_of_msg|> too).
  auto raw = run_json({"--model", dir, "--prompt", "hi", "--max-new", "40"});
  if (raw["completion_ids"].back() == eom) {
    EXPECT_EQ(raw["stop_reason"], "stop_token");
  }
}

TEST(CliRun, SigintStopsCleanlyWithStats) {
  test::Child c({"run", "--model", tiny_with_tokenizer(), "--prompt-ids", "1,2,3", "--max-new",
                 "100000", "--stats"});
  std::string out = c.wait_stdout("\xef", 30);  // some output has streamed
  (void)out;
  c.signal(SIGINT);
  auto r = c.wait(60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("stop: cancelled"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[stats] decode"), std::string::npos) << r.err;
}

TEST(CliRun, BadArgumentsGiveOneLineErrors) {
  const std::string m = tiny_with_tokenizer(), g = test::data_dir() + "/k3-tiny-mxfp4/model";
  const std::string out = test::temp_dir("bad_arguments") + "/logits.f32";
  std::vector<std::vector<std::string>> cases = {
      {"run", "--model", m, "--bogus"},
      {"run", "--model", m},
      {"run", "--model", m, "--prompt", "a", "--prompt-ids", "1"},
      {"run", "--model", m, "--prompt-ids", "1,x"},
      {"run", "--model", m, "--prompt-ids", "1,99999"},
      {"run", "--model", m, "--prompt", "a", "--temperature", "-1"},
      {"run", "--model", m, "--prompt", "a", "--top-p", "0"},
      {"run", "--model", m, "--prompt", "a", "--max-new", "-3"},
      {"run", "--model", m, "--chat", "--prompt", "a", "--effort", "medium"},
      {"run", "--model", m, "--chat", "--prompt", "a", "--think", "maybe"},
      {"run", "--model", m, "--prompt", "a", "--system", "s"},
      {"run", "--model", "/nonexistent/folder", "--prompt", "a"},
      {"run", "--model", g, "--prompt", "needs a tokenizer"},
      {"run", "--model", m, "--prompt-file", "/nonexistent/file"},
      {"chat", "--model", g},
      {"logits", "--model", g, "--tokens", "1", "--out", out, "--mode", "split:9"},
      {"nosuchcommand"},
      {},
  };
  for (const auto& args : cases) {
    auto r = test::run_deltafin(args);
    std::string joined;
    for (auto& a : args) {
      joined += a;
      joined += ' ';
    }
    EXPECT_NE(r.exit_code, 0) << joined;
    EXPECT_EQ(r.err.rfind("deltafin: ", 0), 0u) << joined << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << " -> " << r.err;
  }
}

TEST(CliRun, MissingFolderOrTokenizerIsNamed) {
  const std::string g = test::data_dir() + "/k3-tiny-mxfp4/model";
  for (const std::string cmd : {"chat", "perplexity", "serve"}) {
    std::vector<std::string> extra;
    if (cmd == "perplexity") extra = {"--file", test::data_dir() + "/../../LICENSE"};
    auto args = std::vector<std::string>{cmd, "--model", "/nonexistent/folder"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = test::run_deltafin(args);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("--model /nonexistent/folder: no such folder"), std::string::npos)
        << cmd << ": " << r.err;
    args[2] = g;
    r = test::run_deltafin(args);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("has no tokenizer (tiktoken.model + tokenizer_config.json)"),
              std::string::npos)
        << cmd << ": " << r.err;
  }
}

TEST(CliChat, ThreeTurnsReuseTheState) {
  auto r =
      test::run_deltafin({"chat", "--model", tiny_with_tokenizer(), "--max-new", "6", "--stats"},
                         "Hello there\nSecond turn\n/stats\nThird turn\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Turn 1 prefills everything; turns 2 and 3 reuse the kept state and prefill only new tokens.
  auto first = r.err.find("[stats] full prefill of the conversation");
  ASSERT_NE(first, std::string::npos) << r.err;
  size_t reused = 0, pos = 0;
  while ((pos = r.err.find("reused from the kept state", pos)) != std::string::npos) {
    ++reused;
    ++pos;
  }
  EXPECT_GE(reused, 2u) << r.err;
  EXPECT_NE(r.err.find("[session] 2 turns"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[stats] full prefill", first + 1), std::string::npos) << r.err;
}

// A settings change that alters the start of the rendering (/effort) prefills the conversation
// again; a /load continues from the snapshots the earlier turns kept (the loaded conversation
// is the first turn and its answer).
TEST(CliChat, SettingsChangesPrefillAgainAndALoadContinuesFromSnapshots) {
  const std::string dir = test::temp_dir("chatsave"), file = dir + "/conv.json";
  // Its own snapshot folder: nothing kept by another test is found.
  auto r = test::run_deltafin(
      {"chat", "--model", tiny_with_tokenizer(), "--max-new", "4", "--stats", "--state-cache",
       dir + "/states"},
      "First\n/save " + file + "\n/effort low\nSecond\n/load " + file + "\nThird\n/quit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto saved = json::parse(test::slurp(file));
  ASSERT_EQ(saved["messages"].size(), 2u);
  EXPECT_EQ(saved["messages"][0]["role"], "user");
  EXPECT_EQ(saved["messages"][0]["content"], "First");
  EXPECT_EQ(saved["messages"][1]["role"], "assistant");
  size_t full = 0, pos = 0;
  while ((pos = r.err.find("full prefill of the conversation", pos)) != std::string::npos)
    ++full, ++pos;
  EXPECT_EQ(full, 2u) << r.err;  // the first turn and the one after /effort
  const size_t loaded = r.err.find("loaded ");
  ASSERT_NE(loaded, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reused from the kept state (RAM snapshot", loaded), std::string::npos)
      << r.err;
  // Without the state cache, the loaded conversation is prefilled whole.
  auto none = test::run_deltafin({"chat", "--model", tiny_with_tokenizer(), "--max-new", "4",
                                  "--stats", "--state-cache", "none"},
                                 "/load " + file + "\nThird\n/quit\n");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.err.find("prefills them all: no state cache"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("full prefill of the conversation"), std::string::npos) << none.err;
}

// The built-in demo (no --model, no DELTAFIN_MODEL) is the trained checkpoint embedded in the
// binary: the first run unpacks it into the cache, later runs reuse it, and a damaged or older
// install (stamp mismatch) is replaced instead of being trusted.
TEST(CliRun, DemoModelIsInstalledOnFirstUseAndReinstalledWhenDamaged) {
  std::string cache = test::temp_dir("democache");
  const std::string dir = cache + "/demo-k3-english";
  const test::ScopedEnv own_cache("DELTAFIN_CACHE", cache.c_str());
  const test::ScopedEnv no_model("DELTAFIN_MODEL", nullptr);
  // Greedy, so runs compare (the demo samples by default: its generation_config.json).
  const std::vector<std::string> args = {"run", "--prompt", "The king said", "--max-new",
                                         "8",   "--stats",  "--temperature", "0"};
  auto first = test::run_deltafin(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("using the built-in demo at " + dir), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("trained for"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("[stats] decode"), std::string::npos) << first.err;
  for (const char* f : {"config.json", "model.safetensors.index.json", "tiktoken.model",
                        "tokenizer_config.json", "demo.json", ".deltafin-demo"})
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;

  const auto stamped = fs::last_write_time(dir + "/.deltafin-demo");
  auto again = test::run_deltafin(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, first.out);                                   // greedy: the same text
  EXPECT_EQ(fs::last_write_time(dir + "/.deltafin-demo"), stamped);  // reused, not reinstalled

  // A damaged install: a truncated tokenizer and a stale stamp. The next run reinstalls.
  { std::ofstream(dir + "/tiktoken.model", std::ios::trunc) << "garbage"; }
  { std::ofstream(dir + "/.deltafin-demo", std::ios::trunc) << "00000000-0"; }
  auto repaired = test::run_deltafin(args);
  ASSERT_EQ(repaired.exit_code, 0) << repaired.err;
  EXPECT_EQ(repaired.out, first.out);
}

// The trained demo answers inside the K3 chat format: a thinking section, a non-empty response,
// and its own end of turn (not the token limit). Sampled (seeded): greedy decoding of a model this
// small loops on one phrase, so it is the sampled answer that shows the turn structure.
TEST(CliRun, DemoModelAnswersAChatTurnAndEndsIt) {
  std::string cache = test::temp_dir("demochat");
  test::RunResult r;
  {
    const test::ScopedEnv own_cache("DELTAFIN_CACHE", cache.c_str());
    const test::ScopedEnv no_model("DELTAFIN_MODEL", nullptr);
    r = test::run_deltafin({"run", "--chat", "--prompt", "Hello", "--max-new", "200",
                            "--temperature", "0.7", "--top-p", "1", "--seed", "3", "--json"});
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["stop_reason"], "end_of_turn") << r.out;
  EXPECT_FALSE(j["reasoning"].get<std::string>().empty()) << r.out;
  EXPECT_FALSE(j["text"].get<std::string>().empty()) << r.out;
  EXPECT_EQ(j["text"].get<std::string>().find("<|"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace deltafin
