// The browser page of `deltafin serve` in a real browser (headless Chromium from Debian, driven
// by puppeteer-core from npm, pinned by tests/webui/package-lock.json). The scenarios live in
// tests/webui/webui_test.mjs, which starts the real binary on the tiny model itself (one
// scenario restarts the server on the same port); this test gives it a per-test folder. The
// screenshots of the chat and the engine view go to the per-test folder, or to docs/ when
// DELTAFIN_UPDATE_SCREENSHOTS=1 (tests never write into the source tree unasked). Skips when
// Chromium or node is missing; `make test-deps` installs them where it can.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server_util.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

std::string chromium_path() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

TEST(WebUi, ChatAndEngineViewInChromium) {
  const std::string chromium = chromium_path();
  if (chromium.empty()) GTEST_SKIP() << "chromium not installed (make test-deps installs it)";
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "node/npm not installed";
  }
  const std::string tmp = temp_dir("webui");
  const char* update = std::getenv("DELTAFIN_UPDATE_SCREENSHOTS");
  const std::string docs =
      update && std::string(update) == "1"
          ? (std::filesystem::path(DELTAFIN_TEST_DATA).parent_path().parent_path() / "docs")
                .string()
          : tmp;
  const std::string env = "DELTAFIN_BINARY='" + std::string(DELTAFIN_BINARY) +
                          "' DELTAFIN_MODEL='" + server_model_dir() + "' DELTAFIN_TMP='" + tmp +
                          "' DELTAFIN_SCREENSHOTS='" + docs + "' DELTAFIN_CHROMIUM='" + chromium +
                          "' DELTAFIN_TEST_DATA='" + std::string(DELTAFIN_TEST_DATA) + "'";
  std::string out;
  int code = -1;
  ASSERT_TRUE(run_node_test("webui", "puppeteer-core", env, "webui_test.mjs", out, code)) << out;
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("webui browser test passed"), std::string::npos) << out;
}

// The page's pieces without a browser: assets and their headers, --no-webui, the timings object
// and the engine event stream (with the key, and ending when the client goes away).
TEST(WebUi, PageTimingsAndEngineEvents) {
  ServerProcess srv({"--api-key", "sk-w"});
  ASSERT_TRUE(srv.ready()) << srv.err();
  EXPECT_NE(srv.err().find("in a browser"), std::string::npos) << srv.err();
  auto c = srv.client();
  for (const char* path : {"/", "/app.js", "/style.css"}) {
    auto r = get(*c, path);  // no key needed: the page holds no data
    ASSERT_EQ(r.status, 200) << path;
    EXPECT_NE(r.body.size(), 0u);
    bool csp = false;
    for (const auto& [k, v] : r.headers)
      if (k == "Content-Security-Policy") csp = v.find("script-src 'self'") != std::string::npos;
    EXPECT_TRUE(csp) << path;
  }
  EXPECT_NE(get(*c, "/").body.find("<script src=\"/app.js\""), std::string::npos);
  EXPECT_EQ(post_json(*c, "/", json::object()).status, 405);
  EXPECT_EQ(get(*c, "/v1/engine/events").status, 401);

  const httplib::Headers auth = {{"Authorization", "Bearer sk-w"}};
  auto r = post_json(*c, "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                      {"max_tokens", 5},
                      {"thinking", false}},
                     auth);
  ASSERT_EQ(r.status, 200) << r.body;
  const json& t = r.j["timings"];
  EXPECT_EQ(t["prompt_n"], r.j["usage"]["prompt_tokens"]);
  EXPECT_EQ(t["predicted_n"], r.j["usage"]["completion_tokens"]);
  EXPECT_GT(t["prompt_ms"].get<double>(), 0);
  EXPECT_GE(t["ttft_ms"].get<double>(), t["prompt_ms"].get<double>());
  const double decoded = r.j["usage"]["completion_tokens"].get<double>() - 1;
  if (decoded > 0) {
    EXPECT_NEAR(t["predicted_per_second"].get<double>() * t["predicted_ms"].get<double>() / 1e3,
                decoded, 1e-6);
  }
  // Streamed: the usage chunk carries timings too.
  auto s = post_json(*c, "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                      {"max_tokens", 3},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}},
                     auth);
  ASSERT_EQ(s.status, 200);
  const auto events = sse_events(s.body);
  ASSERT_GE(events.size(), 2u);
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["timings"]["predicted_n"], last["usage"]["completion_tokens"]) << last.dump();

  auto ev = c->Get("/v1/engine/events", auth, [&](const char* data, size_t n) {
    std::string chunk(data, n);
    const size_t at = chunk.find("data: ");
    if (at == std::string::npos) return true;
    const json j = json::parse(chunk.substr(at + 6), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << chunk;
    EXPECT_GT(j["experts"]["requests"].get<int64_t>(), 0) << chunk;
    EXPECT_TRUE(j["memory"].is_object()) << chunk;
    EXPECT_EQ(j["heat"]["hits"].size(), static_cast<size_t>(j["heat"]["layers"].get<int>() *
                                                            j["heat"]["experts"].get<int>()));
    uint64_t total = 0;
    for (const auto& v : j["heat"]["hits"]) total += v.get<uint64_t>();
    for (const auto& v : j["heat"]["misses"]) total += v.get<uint64_t>();
    EXPECT_EQ(total, j["experts"]["hits"].get<uint64_t>() + j["experts"]["misses"].get<uint64_t>());
    return false;  // one snapshot is enough
  });
  EXPECT_EQ(srv.stop(), 0);

  ServerProcess off({"--no-webui"});
  ASSERT_TRUE(off.ready()) << off.err();
  auto oc = off.client();
  EXPECT_EQ(get(*oc, "/").status, 404);
  EXPECT_EQ(get(*oc, "/app.js").status, 404);
  // Engine event streams: at most 4 at once; one whose client went away ends and frees its place.
  {
    std::vector<std::unique_ptr<RawClient>> open;
    for (int i = 0; i < 4; ++i) {
      open.push_back(std::make_unique<RawClient>(off.port()));
      ASSERT_TRUE(open.back()->send_request("GET", "/v1/engine/events", ""));
      const std::string got = open.back()->read_until("\"heat\"", 10);
      ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
      ASSERT_NE(got.find("text/event-stream"), std::string::npos) << got;
    }
    RawClient fifth(off.port());
    ASSERT_TRUE(fifth.send_request("GET", "/v1/engine/events", ""));
    EXPECT_NE(fifth.read_until("too_many_streams", 10).find("429"), std::string::npos);
    for (auto& r : open) r->close_now();
  }
  bool reopened = false;
  for (int i = 0; i < 100 && !reopened; ++i) {  // the streams notice within a snapshot period
    RawClient again(off.port());
    ASSERT_TRUE(again.send_request("GET", "/v1/engine/events", ""));
    reopened = again.read_until("\"heat\"", 10).find("200 OK") != std::string::npos;
    again.close_now();
    if (!reopened) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reopened);
  EXPECT_EQ(off.stop(), 0);
}

// `bench --report`: a self-contained HTML file with the figures the JSON has.
// The engine view's timeline without a browser: while an engine stream is open, a request's passes
// come back in a frame's `timeline` as nested spans on the scheduler thread (a pass holds its
// layers, a layer its attention), within the window the frame states.
TEST(WebUi, EngineEventsCarryTheLastPassesAsATimeline) {
  ServerProcess srv({"--api-key", "sk-t"});
  ASSERT_TRUE(srv.ready()) << srv.err();
  const httplib::Headers auth = {{"Authorization", "Bearer sk-t"}};
  std::atomic<bool> streaming{false};
  std::thread side([&] {
    for (int i = 0; i < 600 && !streaming.load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto c = srv.client();
    post_json(*c, "/v1/chat/completions",
              {{"messages", {{{"role", "user"}, {"content", "timeline"}}}},
               {"max_tokens", 6},
               {"thinking", false}},
              auth);
  });
  json timeline;
  int frames = 0;
  std::string pending;  // a frame with a timeline spans several reads
  auto c = srv.client();
  c->Get("/v1/engine/events", auth, [&](const char* data, size_t n) {
    pending.append(data, n);
    for (size_t end = pending.find("\n\n"); end != std::string::npos; end = pending.find("\n\n")) {
      const std::string frame = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (frame.rfind("data: ", 0) != 0) continue;
      streaming = true;
      const json j = json::parse(frame.substr(6), nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << frame;
      if (!j.is_discarded() && j.contains("timeline")) timeline = j["timeline"];
      ++frames;
    }
    return timeline.is_null() && frames < 120;  // 60 s at most
  });
  streaming = true;
  side.join();
  ASSERT_TRUE(timeline.is_object()) << "no frame carried a timeline in " << frames << " frames";
  const int passes = timeline["passes"];
  EXPECT_GE(passes, 1);
  EXPECT_LE(passes, 3);
  const double window = timeline["duration_us"];
  EXPECT_GT(window, 0);
  std::map<int, std::string> names;
  for (const json& t : timeline["threads"]) names[t["tid"].get<int>()] = t["name"];
  struct Rec {
    std::string name;
    double ts, dur;
  };
  std::map<int, std::vector<Rec>> by_tid;
  for (const json& s : timeline["spans"]) {
    ASSERT_TRUE(s.is_array() && s.size() == 5) << s.dump();
    ASSERT_TRUE(names.count(s[0].get<int>())) << "span on an unnamed thread: " << s.dump();
    by_tid[s[0].get<int>()].push_back({s[1], s[2], s[3]});
  }
  int scheduler = -1;
  for (const auto& [tid, name] : names)
    if (name == "scheduler") scheduler = tid;
  ASSERT_GE(scheduler, 0) << timeline["threads"].dump();
  auto& list = by_tid[scheduler];
  std::sort(list.begin(), list.end(), [](const Rec& a, const Rec& b) {
    return a.ts < b.ts || (a.ts == b.ts && a.dur > b.dur);
  });
  // The passes lie in the window, and each layer inside a pass, each attention inside a layer.
  std::vector<const Rec*> open;
  int pass_count = 0, layers_in_pass = 0, attention_in_layer = 0;
  for (const Rec& r : list) {
    while (!open.empty() && r.ts >= open.back()->ts + open.back()->dur) open.pop_back();
    if (r.name == "pass") {
      ++pass_count;
      EXPECT_GE(r.ts, -1e-3);
      EXPECT_LE(r.ts + r.dur, window + 1e-3);
    }
    if (!open.empty()) {
      EXPECT_LE(r.ts + r.dur, open.back()->ts + open.back()->dur + 1e-3)
          << r.name << " overlaps the end of " << open.back()->name;
      if (r.name == "layer" && open.back()->name == "pass") ++layers_in_pass;
      if (r.name == "attention" && open.back()->name == "layer") ++attention_in_layer;
    }
    open.push_back(&r);
  }
  EXPECT_EQ(pass_count, passes);
  EXPECT_GT(layers_in_pass, 0);
  EXPECT_GT(attention_in_layer, 0);
  EXPECT_EQ(srv.stop(), 0);
}

TEST(WebUi, BenchReportIsSelfContainedHtml) {
  const std::string dir = temp_dir("bench-report");
  const std::string file = dir + "/report.html";
  auto r =
      run_deltafin({"bench", "--model", server_model_dir(), "--prompt-tokens", "8", "--gen-tokens",
                    "3", "--reps", "2", "--no-disk-probe", "--json", "--report", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["decode_tokens_per_s_reps"].size(), 2u);
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string html = ss.str();
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http"), html.find("http://www.w3.org/2000/svg"));  // no outside links
  size_t svgs = 0;
  for (size_t at = 0; (at = html.find("<svg", at)) != std::string::npos; ++at) ++svgs;
  EXPECT_EQ(svgs, 5u);  // decode, prefill, bytes per token, decode and prefill rooflines
  EXPECT_NE(html.find("Prefill roofline"), std::string::npos);
  EXPECT_NE(html.find(fmt::format("time to first token {:.3f} s", j["ttft_s"].get<double>())),
            std::string::npos);
  EXPECT_NE(html.find("repetition 2"), std::string::npos);
  EXPECT_NE(
      html.find(fmt::format("{:.3f} tokens/s", j["decode_tokens_per_s_reps"][1].get<double>())),
      std::string::npos);
  auto bad = run_deltafin({"bench", "--model", server_model_dir(), "--report", dir + "/no/r.html"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("does not exist"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace deltafin::test
