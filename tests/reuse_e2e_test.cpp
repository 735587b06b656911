// State reuse end to end (issue 26, "Done when"): through the real `deltafin serve` and the
// official OpenAI Node client (tests/openai_client/reuse_test.mjs), every turn prefills only what
// the client added; the answers equal those of a server that reuses nothing; a restarted server
// continues from the snapshots on disk. prefix_test.cpp covers the store itself bit for bit.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server_util.h"
#include "storage/checkpoint.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

bool have_node() {
  return std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") == 0;
}

// Runs the client script against `srv`; returns its "answers: ..." line (empty on failure, the
// test failed with the script's output).
std::string run_reuse_client(const ServerProcess& srv, const std::string& phase,
                             const std::string& file, bool check) {
  std::string out;
  int code = -1;
  const std::string env = "DELTAFIN_BASE_URL=" + srv.base_url() + "/v1 REUSE_PHASE=" + phase +
                          " REUSE_FILE='" + file + "' REUSE_CHECK=" + (check ? "1" : "0");
  EXPECT_TRUE(run_node_test("openai_client", "openai", env, "reuse_test.mjs", out, code)) << out;
  EXPECT_EQ(code, 0) << out << "\n" << srv.err();
  const size_t p = out.find("answers: ");
  if (code != 0 || p == std::string::npos) return "";
  return out.substr(p, out.find('\n', p) - p);
}

// Thinking on, the client sending back only `content`: the 5 turns, regenerate, an edited last
// message, response_format, tool_choice and a second conversation over a shared 1,000-token
// system prompt each prefill at most what the client added plus the generation prompt (the
// script checks each); then the first turn after a restart over the same --state-cache folder.
// The answers are those of a server with --state-cache none, turn for turn.
TEST(ReuseOpenAIClient, EveryTurnPrefillsOnlyWhatTheClientAdded) {
  if (!have_node()) GTEST_SKIP() << "node/npm not installed";
  const std::string dir = temp_dir("reuse-states");
  const std::string states = dir + "/states";
  std::string turns, restarted;
  {
    ServerProcess srv({"--state-cache", states});
    ASSERT_TRUE(srv.ready()) << srv.err();
    turns = run_reuse_client(srv, "turns", dir + "/conversation.json", true);
    ASSERT_FALSE(turns.empty());
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
  {
    ServerProcess srv({"--state-cache", states});
    ASSERT_TRUE(srv.ready()) << srv.err();
    restarted = run_reuse_client(srv, "restart", dir + "/conversation.json", true);
    EXPECT_NE(srv.err().find("cached from disk"), std::string::npos) << srv.err();
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
  ServerProcess fresh({"--state-cache", "none"});
  ASSERT_TRUE(fresh.ready()) << fresh.err();
  EXPECT_EQ(run_reuse_client(fresh, "turns", dir + "/fresh.json", false), turns);
  EXPECT_EQ(run_reuse_client(fresh, "restart", dir + "/conversation.json", false), restarted);
  EXPECT_EQ(fresh.stop(), 0) << fresh.err();
}

// Faults through the binary. Each case serves the same two-turn conversation and must answer it
// exactly as a server that reuses nothing, with one clear `state cache:` line on stderr per bad
// file or failure, and nothing wrong reused.
json turn_body(const json& messages) {
  return {{"model", "kimi-k3"},
          {"messages", messages},
          {"max_tokens", 5},
          {"temperature", 0},
          {"thinking", false}};
}

struct TwoTurns {
  json first, second;  // the answers' messages
  int cached_first = -1, cached_second = -1;
};

TwoTurns converse(const ServerProcess& srv) {
  TwoTurns t;
  auto c = srv.client();
  json m = json::array({{{"role", "user"}, {"content", "Tell me about the sea and the sky."}}});
  auto r1 = post_json(*c, "/v1/chat/completions", turn_body(m));
  EXPECT_EQ(r1.status, 200) << r1.body << "\n" << srv.err();
  if (r1.status != 200) return t;
  t.first = r1.j["choices"][0]["message"]["content"];
  t.cached_first = r1.j["usage"]["prompt_tokens_details"]["cached_tokens"];
  m.push_back({{"role", "assistant"}, {"content", t.first}});
  m.push_back({{"role", "user"}, {"content", "And the mountains?"}});
  auto r2 = post_json(*c, "/v1/chat/completions", turn_body(m));
  EXPECT_EQ(r2.status, 200) << r2.body << "\n" << srv.err();
  if (r2.status != 200) return t;
  t.second = r2.j["choices"][0]["message"]["content"];
  t.cached_second = r2.j["usage"]["prompt_tokens_details"]["cached_tokens"];
  return t;
}

// The repetition penalty sees the last 64 prompt tokens; a continued request prefills only a
// few of them, so the window must reach back into the reused prefix or the answer would differ
// from a server that prefilled everything. The request is sent twice (regenerate: the second
// prefills only the generation prompt), the second time strongly favouring the tokens of a word
// of its message (logit_bias) under a maximal penalty: with the word in the window the penalty
// divides their logits by 100, without it the word wins.
TEST(ReuseSampling, TheRepetitionWindowReachesIntoTheReusedPrefix) {
  auto regenerate = [](const ServerProcess& srv) {
    auto c = srv.client();
    auto t = post_json(*c, "/tokenize", json{{"content", " zebra"}});
    EXPECT_EQ(t.status, 200) << t.body;
    json bias = json::object();
    for (const auto& id : t.j["tokens"]) bias[std::to_string(id.get<int>())] = 50;
    json m = json::array({{{"role", "user"}, {"content", "A zebra"}}});
    auto r1 = post_json(*c, "/v1/chat/completions", turn_body(m));
    EXPECT_EQ(r1.status, 200) << r1.body;
    json b = turn_body(m);
    b["logit_bias"] = bias;
    b["repetition_penalty"] = 100;
    b["max_tokens"] = 1;
    auto r2 = post_json(*c, "/v1/chat/completions", b);
    EXPECT_EQ(r2.status, 200) << r2.body;
    return r2.j;
  };
  ServerProcess srv({"--state-cache", temp_dir("reuse-window")});
  ASSERT_TRUE(srv.ready()) << srv.err();
  const json reused = regenerate(srv);
  EXPECT_EQ(srv.stop(), 0) << srv.err();
  ServerProcess fresh({"--state-cache", "none"});
  ASSERT_TRUE(fresh.ready()) << fresh.err();
  const json full = regenerate(fresh);
  EXPECT_EQ(fresh.stop(), 0) << fresh.err();
  const int cached = reused["usage"]["prompt_tokens_details"]["cached_tokens"];
  const int prompt = reused["usage"]["prompt_tokens"];
  EXPECT_GT(cached, 0) << reused.dump();
  EXPECT_LT(prompt - cached, 64) << reused.dump();  // the window reaches into the prefix
  EXPECT_EQ(reused["choices"][0]["message"]["content"], full["choices"][0]["message"]["content"])
      << reused.dump() << "\n"
      << full.dump();
}

// The `state cache:` warning lines of a server's stderr.
std::vector<std::string> cache_warnings(const std::string& err) {
  std::vector<std::string> out;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.find("state cache:") != std::string::npos) out.push_back(line);
  return out;
}

std::vector<std::string> snapshot_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".dfsnap") out.push_back(e.path().string());
  return out;
}

// Snapshots of the conversation's first turn, written into `dir` by a server.
void first_turn_snapshots(const std::string& dir) {
  ServerProcess srv({"--state-cache", dir});
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  json m = json::array({{{"role", "user"}, {"content", "Tell me about the sea and the sky."}}});
  ASSERT_EQ(post_json(*c, "/v1/chat/completions", turn_body(m)).status, 200) << srv.err();
  EXPECT_EQ(srv.stop(), 0) << srv.err();
  EXPECT_FALSE(snapshot_files(dir).empty());
}

TwoTurns reference_answers(const std::string& model = "") {
  ServerProcess srv({"--state-cache", "none"}, model);
  EXPECT_TRUE(srv.ready()) << srv.err();
  TwoTurns t = converse(srv);
  EXPECT_EQ(t.cached_second, 0);
  return t;
}

TEST(ReuseFaults, BadSnapshotFilesAreIgnoredWithOneLineEach) {
  // A fine-tune of the server's model: the same config and tensor headers, other embeddings.
  const std::string tuned = temp_dir("reuse-tuned") + "/model";
  fs::copy(server_model_dir(), tuned);
  {
    auto ck = Checkpoint::open(tuned);
    const TensorInfo& e = ck->get("language_model.model.embed_tokens.weight");
    const std::string shard = ck->shards()[static_cast<size_t>(e.shard)].path();
    std::string bytes = slurp(shard);
    for (uint64_t i = 0; i < e.nbytes; ++i) bytes[e.offset + i] ^= 0x20;
    ck.reset();
    spit(shard, bytes);
  }
  for (const std::string how : {"truncated", "flipped", "foreign"}) {
    SCOPED_TRACE(how);
    const std::string model = how == "foreign" ? tuned : "";
    const TwoTurns want = reference_answers(model);
    const std::string dir = temp_dir("reuse-bad-" + how);
    first_turn_snapshots(dir);
    const auto files = snapshot_files(dir);
    for (const auto& f : files) {
      if (how == "truncated") {
        fs::resize_file(f, fs::file_size(f) / 2);
      } else if (how == "flipped") {
        std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
        const auto at = static_cast<std::streamoff>(fs::file_size(f) * 2 / 3);
        io.seekg(at);
        char c = 0;
        io.read(&c, 1);
        io.seekp(at);
        c = static_cast<char>(c ^ 0x04);
        io.write(&c, 1);
      }
    }
    ServerProcess srv({"--state-cache", dir}, model);
    ASSERT_TRUE(srv.ready()) << srv.err();
    const TwoTurns got = converse(srv);
    EXPECT_EQ(got.first, want.first);
    EXPECT_EQ(got.second, want.second);
    EXPECT_EQ(got.cached_first, 0);  // nothing of a bad file is used
    const auto lines = cache_warnings(srv.err());
    // Every bad file that was looked at is named once, on its own line, and removed; the first
    // turn restored nothing from them (the second continues the first's new snapshots). The
    // headers are checked when the folder is indexed (truncated, foreign: every file), the
    // checksum when a file would be used (flipped: the files on the conversation's path).
    EXPECT_GE(lines.size(), 1u) << srv.err();
    if (how != "flipped") {
      EXPECT_EQ(lines.size(), files.size()) << srv.err();
    }
    for (const auto& l : lines) {
      EXPECT_NE(l.find("ignoring"), std::string::npos) << l;
      EXPECT_EQ(std::count_if(files.begin(), files.end(),
                              [&](const std::string& f) { return l.find(f) != std::string::npos; }),
                1)
          << l;
    }
    for (const auto& f : files) {
      const auto named = std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
        return l.find(f) != std::string::npos;
      });
      EXPECT_LE(named, 1) << f;  // (a removed file's name is reused by the new snapshot)
    }
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
}

TEST(ReuseFaults, AFullDiskOrAnUnwritableFolderKeepsSnapshotsInRam) {
  const TwoTurns want = reference_answers();
  for (const std::string how : {"full", "unwritable"}) {
    SCOPED_TRACE(how);
    std::string dir = temp_dir("reuse-" + how);
    if (how == "full") {
      ::setenv("DELTAFIN_FAULT", "kind=enospc;match=dfsnap;count=0", 1);
    } else {
      std::ofstream(dir + "/plain") << "x";  // a folder under a regular file cannot be made
      dir += "/plain/states";
    }
    ServerProcess srv({"--state-cache", dir});
    ::unsetenv("DELTAFIN_FAULT");
    ASSERT_TRUE(srv.ready()) << srv.err();
    const TwoTurns got = converse(srv);
    EXPECT_EQ(got.first, want.first);
    EXPECT_EQ(got.second, want.second);
    EXPECT_GT(got.cached_second, 0);  // from the RAM tier
    EXPECT_EQ(cache_warnings(srv.err()).size(), 1u) << srv.err();
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
}

// Only regular files in the folder are snapshots: a FIFO named like one blocked the start-up
// forever (/health said loading) before (issue 39, finding 5). A FIFO, a link (here to a real
// snapshot elsewhere) and a folder named like snapshots or their temporaries are each skipped
// with one line, and left as they are; the real files are used.
TEST(ReuseFaults, WhatIsNotARegularFileIsSkippedAndLeftAsItIs) {
  const TwoTurns want = reference_answers();
  const std::string dir = temp_dir("reuse-fifo");
  first_turn_snapshots(dir);
  const std::string elsewhere = temp_dir("reuse-fifo-elsewhere") + "/snapshot.dfsnap";
  fs::copy_file(snapshot_files(dir).front(), elsewhere);
  const std::vector<std::string> odd = {dir + "/a-fifo.dfsnap", dir + "/a-link.dfsnap",
                                        dir + "/a-folder.dfsnap", dir + "/b-fifo.dfsnap.tmp"};
  ASSERT_EQ(::mkfifo(odd[0].c_str(), 0600), 0);
  fs::create_symlink(elsewhere, odd[1]);
  fs::create_directory(odd[2]);
  ASSERT_EQ(::mkfifo(odd[3].c_str(), 0600), 0);
  ServerProcess srv({"--state-cache", dir});
  ASSERT_TRUE(srv.ready()) << srv.err();
  const TwoTurns got = converse(srv);
  EXPECT_EQ(got.first, want.first);
  EXPECT_EQ(got.second, want.second);
  EXPECT_GT(got.cached_first, 0);  // the first turn's snapshots are used
  const auto lines = cache_warnings(srv.err());
  EXPECT_EQ(lines.size(), odd.size()) << srv.err();
  for (const auto& o : odd) {
    EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                            [&](const std::string& l) {
                              return l.find("ignoring " + o + ": it is a") != std::string::npos &&
                                     l.find("left as it is") != std::string::npos;
                            }),
              1)
        << o << "\n"
        << srv.err();
  }
  EXPECT_EQ(srv.stop(), 0) << srv.err();
  EXPECT_TRUE(fs::is_fifo(odd[0]));
  EXPECT_TRUE(fs::is_symlink(odd[1]));
  EXPECT_TRUE(fs::is_directory(odd[2]));
  EXPECT_TRUE(fs::is_fifo(odd[3]));
  EXPECT_TRUE(fs::is_regular_file(elsewhere));
}

// Two servers given one folder would each keep --state-cache-size of files in it (twice the
// cap) and remove each other's unfinished writes (issue 39, finding 9). The folder is the first
// server's; the second says so in one line naming the first's pid, keeps its snapshots in RAM
// and answers as usual.
TEST(ReuseFaults, ASecondServerOnTheSameFolderKeepsItsSnapshotsInRam) {
  const TwoTurns want = reference_answers();
  const std::string dir = temp_dir("reuse-shared");
  ServerProcess owner({"--state-cache", dir});
  ASSERT_TRUE(owner.ready()) << owner.err();
  ServerProcess second({"--state-cache", dir});
  ASSERT_TRUE(second.ready()) << second.err();
  const TwoTurns got = converse(second);
  EXPECT_EQ(got.first, want.first);
  EXPECT_EQ(got.second, want.second);
  EXPECT_GT(got.cached_second, 0);  // from the RAM tier
  const auto lines = cache_warnings(second.err());
  ASSERT_EQ(lines.size(), 1u) << second.err();
  EXPECT_NE(lines[0].find(dir + " is in use by another deltafin process (pid " +
                          std::to_string(owner.pid()) + ")"),
            std::string::npos)
      << lines[0];
  EXPECT_TRUE(snapshot_files(dir).empty()) << "the second server wrote into the first's folder";
  EXPECT_EQ(second.stop(), 0) << second.err();
  EXPECT_EQ(owner.stop(), 0) << owner.err();
  EXPECT_TRUE(cache_warnings(owner.err()).empty()) << owner.err();
}

}  // namespace
}  // namespace deltafin::test
