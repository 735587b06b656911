// Fault injection through the real server (core/fault_inject.h, DELTAFIN_FAULT): a checkpoint
// read that fails with EIO, returns short, sees its file shrink, or is slow — in the trunk
// streamer, in the expert store, and while the model loads — and a sequence state that cannot
// be allocated. Each fault must reach the one request (or the start-up) that needed the data
// as a clear error naming the file; the process stays healthy and the next request is served.
//
// The server runs the tiny synthetic model under the smallest memory budget its plan accepts,
// so the trunk streams on every pass and experts are read on demand. Faults are armed by a file
// the test creates once the server is ready, so loading is clean and the fault hits exactly the
// next matching read.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "model/config.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using test::get;
using test::post_json;
using test::ServerProcess;
using json = nlohmann::ordered_json;

// The smallest budget the plan takes for one sequence of 256 positions and 16-row passes.
std::string small_budget() {
  const std::string& dir = test::server_model_dir();
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  PlanOptions o;
  o.budget = 1ull << 40;
  o.shape.max_rows = 16;
  o.context = 256;
  o.shape.sequences = 1;
  o.prefetch = false;
  return std::to_string(plan_memory(c, *ck, o).min_working_set / 1024 + 64) + "K";
}

// `deltafin serve` with DELTAFIN_FAULT=spec in its environment only.
// `streaming`: the smallest budget (the trunk streams); else the default one (it is resident,
// read while loading).
std::unique_ptr<ServerProcess> serve_with_fault(const std::string& spec, bool streaming = true) {
  std::vector<std::string> args = {"--ctx",      "256", "--prefill-chunk", "16",
                                   "--parallel", "1",   "--state-cache",   "none",
                                   "--readers",  "2"};
  if (streaming) {
    for (const std::string& a :
         {std::string("--memory-budget"), small_budget(), std::string("--no-prefetch")})
      args.push_back(a);
  }
  ::setenv("DELTAFIN_FAULT", spec.c_str(), 1);
  auto srv = std::make_unique<ServerProcess>(args);
  ::unsetenv("DELTAFIN_FAULT");
  return srv;
}

json body(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}};
}

std::string error_message(const test::HttpResult& r) {
  if (!test::is_error_shape(r.j)) return "(not an error object: " + r.body + ")";
  return r.j["error"]["message"].get<std::string>();
}

// A server whose fault (spec + ";arm=FILE") is armed by arm(), after one request was served.
struct Armed {
  std::string arm_file;
  std::unique_ptr<ServerProcess> srv;
  std::unique_ptr<httplib::Client> cli;
  test::HttpResult before;
  void arm() const { test::spit(arm_file, ""); }
};

Armed start_armed(const std::string& spec) {
  Armed a;
  a.arm_file = test::temp_dir("fault-arm") + "/armed";
  a.srv = serve_with_fault(spec + ";arm=" + a.arm_file);
  if (!a.srv->ready()) return a;
  a.cli = a.srv->client(60);
  a.before = post_json(*a.cli, "/v1/completions", body("The king said"));
  return a;
}

struct Case {
  const char* kind;
  const char* match;
  const char* expect;  // in the error message
};

class ReadFaults : public ::testing::TestWithParam<Case> {};

// Served before the fault is armed; the request the fault hits gets a 500 naming the failure
// and the shard; the server still answers /health and serves the next request the same text.
TEST_P(ReadFaults, FailOnlyTheRequestThatNeededTheData) {
  const Case& c = GetParam();
  Armed a = start_armed(std::string("kind=") + c.kind + ";match=" + c.match);
  ASSERT_TRUE(a.srv->ready()) << a.srv->err();
  auto& srv = a.srv;
  auto& cli = a.cli;
  const auto& before = a.before;
  ASSERT_EQ(before.status, 200) << before.body;

  a.arm();
  const auto hit = post_json(*cli, "/v1/completions", body("Once upon a time"));
  EXPECT_EQ(hit.status, 500) << hit.body;
  const std::string msg = error_message(hit);
  EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  EXPECT_NE(msg.find(".safetensors"), std::string::npos) << "names the shard: " << msg;
  // The server's stderr reaches the test through a pipe read on another thread, so the fault
  // line may arrive just after the response (seen under TSan): wait for it, up to 10 s.
  for (int i = 0; i < 200 && srv->err().find("DELTAFIN_FAULT: injecting") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(srv->err().find("DELTAFIN_FAULT: injecting"), std::string::npos) << srv->err();

  EXPECT_EQ(get(*cli, "/health").status, 200);
  const auto after = post_json(*cli, "/v1/completions", body("The king said"));
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j["choices"][0]["text"], before.j["choices"][0]["text"]);
  EXPECT_TRUE(srv->running());
  EXPECT_EQ(srv->stop(), 0) << srv->err();
}

INSTANTIATE_TEST_SUITE_P(Server, ReadFaults,
                         ::testing::Values(Case{"eio", "trunk weights", "Input/output error"},
                                           Case{"short", "trunk weights", "short read"},
                                           Case{"shrink", "trunk weights", "short read"},
                                           Case{"eio", "expert", "Input/output error"},
                                           Case{"short", "expert", "short read"},
                                           Case{"shrink", "expert", "short read"}),
                         [](const auto& info) {
                           std::string m = info.param.match;
                           return std::string(info.param.kind) + "_" +
                                  (m == "expert" ? "ExpertStore" : "Trunk");
                         });

// A slow read delays the request that waits for it and nothing else: the answer is the same.
TEST(ServerFaults, SlowReadsOnlyDelay) {
  Armed a = start_armed("kind=slow;delay_ms=200;count=4");
  ASSERT_TRUE(a.srv->ready()) << a.srv->err();
  ASSERT_EQ(a.before.status, 200) << a.before.body;
  a.arm();
  const auto slow = post_json(*a.cli, "/v1/completions", body("The king said"));
  ASSERT_EQ(slow.status, 200) << slow.body;
  EXPECT_EQ(slow.j["choices"][0]["text"], a.before.j["choices"][0]["text"]);
  EXPECT_NE(a.srv->err().find("slow-read"), std::string::npos) << a.srv->err();
  EXPECT_EQ(a.srv->stop(), 0) << a.srv->err();
}

// Loading: a read that fails while the model loads (the resident trunk is read then) stops
// `serve` with one clear error naming the shard and exit 1, never a crash or a server that
// claims to be ready.
TEST(ServerFaults, ReadFaultWhileLoadingIsAClearStartError) {
  for (const char* kind : {"eio", "short", "shrink"}) {
    SCOPED_TRACE(kind);
    ::setenv("DELTAFIN_FAULT", (std::string("kind=") + kind + ";count=1").c_str(), 1);
    const auto r = test::run_deltafin(
        {"serve", "--model", test::server_model_dir(), "--port", "0", "--ctx", "256"}, "", 120);
    ::unsetenv("DELTAFIN_FAULT");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(".safetensors"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::string(kind) == "eio" ? "Input/output error" : "short read"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("ready:"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }
}

// Out of memory when a sequence's state is allocated: that request gets a 503 with
// Retry-After in the OpenAI error shape; the next one is served.
TEST(ServerFaults, OutOfMemoryForAStateIsA503) {
  Armed a = start_armed("kind=oom;match=sequence state");
  ASSERT_TRUE(a.srv->ready()) << a.srv->err();
  ASSERT_EQ(a.before.status, 200) << a.before.body;
  a.arm();
  const auto refused = post_json(*a.cli, "/v1/completions", body("The king said"));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(error_message(refused).find("not enough memory"), std::string::npos) << refused.body;
  EXPECT_EQ(refused.headers.count("Retry-After"), 1u);
  const auto next = post_json(*a.cli, "/v1/completions", body("The king said"));
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(a.srv->stop(), 0) << a.srv->err();
}

}  // namespace
}  // namespace deltafin
