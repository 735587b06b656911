// The C API (include/deltafin/deltafin.h) through libdeltafin.so itself: the test binary links
// the shared library, whose C++ insides are hidden, so these calls go through the exported ABI
// exactly as another language would. Results are checked against the real `deltafin` binary
// (run --json ids, logits bytes) and the server's response shapes.
#include <deltafin/deltafin.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/synthetic.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

const std::string& tiny() {
  static const std::string dir = [] {
    std::string d = test::temp_dir("capi") + "/model";
    make_model(d, synthetic_preset("tiny"));
    return d;
  }();
  return dir;
}

deltafin_model* load(const std::string& dir, int threads = 1) {
  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.threads = threads;
  p.memory_budget = 1ull << 30;
  p.ctx = 512;
  deltafin_model* m = nullptr;
  EXPECT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  return m;
}

std::string take(char* s) {
  std::string r = s != nullptr ? s : "";
  deltafin_free(s);
  return r;
}

std::vector<int32_t> tokenize(deltafin_model* m, const std::string& text) {
  int32_t* ids = nullptr;
  size_t n = 0;
  EXPECT_EQ(deltafin_tokenize(m, text.data(), text.size(), 0, &ids, &n), DELTAFIN_OK);
  std::vector<int32_t> v(ids, ids + n);
  deltafin_free(ids);
  return v;
}

json greedy(deltafin_model* m, const std::vector<int32_t>& prompt, int64_t max_new) {
  deltafin_session* s = nullptr;
  EXPECT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK);
  deltafin_sampling_params sp;
  deltafin_sampling_params_init(&sp);
  sp.max_new_tokens = max_new;
  char* out = nullptr;
  EXPECT_EQ(deltafin_session_generate(s, prompt.data(), prompt.size(), &sp, nullptr, nullptr, &out),
            DELTAFIN_OK)
      << deltafin_last_error();
  deltafin_session_free(s);
  return json::parse(take(out));
}

TEST(CApi, VersionAndAbi) {
  EXPECT_EQ(deltafin_abi_version(), DELTAFIN_ABI_VERSION);
  EXPECT_STREQ(deltafin_version(), DELTAFIN_VERSION);
}

TEST(CApi, GreedyGenerationMatchesTheCli) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  const auto prompt = tokenize(m, "Once upon a time");
  ASSERT_FALSE(prompt.empty());
  json j = greedy(m, prompt, 10);
  auto r = test::run_deltafin({"run", "--json", "--model", tiny(), "--prompt", "Once upon a time",
                               "--max-new", "10", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json cli = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], cli["prompt_ids"]);
  EXPECT_EQ(j["completion_ids"], cli["completion_ids"]);
  EXPECT_EQ(j["text"], cli["text"]);
  EXPECT_EQ(j["completion_tokens"], 10);
  deltafin_model_free(m);
}

TEST(CApi, LogitsEqualTheCliBitForBit) {
  const std::string dir = test::data_dir() + "/k3-tiny-mxfp4/model";  // no tokenizer
  deltafin_model* m = load(dir);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(deltafin_model_has_tokenizer(m), 0);
  const std::vector<int32_t> ids = {5, 17, 200, 3, 99};
  const int64_t vocab = deltafin_model_vocab(m);
  std::vector<float> got(ids.size() * static_cast<size_t>(vocab));
  deltafin_session* s = nullptr;
  ASSERT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK);
  ASSERT_EQ(deltafin_session_eval(s, ids.data(), ids.size(), 1, got.data()), DELTAFIN_OK)
      << deltafin_last_error();
  EXPECT_EQ(deltafin_session_position(s), 5);
  const std::string out = test::temp_dir("capi-logits") + "/l.f32";
  auto r =
      test::run_deltafin({"logits", "--model", dir, "--tokens", "5,17,200,3,99", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string want = test::slurp(out);
  ASSERT_EQ(want.size(), got.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0);
  // Without a tokenizer, text calls say what is missing.
  int32_t* t = nullptr;
  size_t n = 0;
  EXPECT_EQ(deltafin_tokenize(m, "x", 1, 0, &t, &n), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("no tokenizer"), std::string::npos);
  deltafin_session_free(s);
  deltafin_model_free(m);
}

// The appended `homes` option: a model reads its experts from homes `deltafin place` filled with
// the same logits as without; "homes" in the stats JSON has the model folder and each home; an
// older caller (smaller struct_size) and a NULL list with a count are handled.
TEST(CApi, HomesGiveTheSameLogitsAndPerDriveStats) {
  const std::string dir = tiny();
  const std::string home = test::temp_dir("capi-home") + "/home";
  auto r = test::run_deltafin(
      {"place", "--model", dir, "--home", home, "--probe-size", "1M", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.threads = 1;
  p.memory_budget = 48ull << 20;  // experts are read on every pass
  p.ctx = 256;
  p.direct_io = 0;
  std::vector<int32_t> ids = {5, 17, 200, 3, 99, 42, 7};
  auto logits = [&](deltafin_model* m) {
    std::vector<float> out(ids.size() * static_cast<size_t>(deltafin_model_vocab(m)));
    deltafin_session* s = nullptr;
    EXPECT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK);
    EXPECT_EQ(deltafin_session_eval(s, ids.data(), ids.size(), 1, out.data()), DELTAFIN_OK)
        << deltafin_last_error();
    deltafin_session_free(s);
    return out;
  };
  auto stats = [](deltafin_model* m) {
    char* j = nullptr;
    EXPECT_EQ(deltafin_model_stats_json(m, &j), DELTAFIN_OK);
    return json::parse(take(j));
  };
  deltafin_model* m = nullptr;
  ASSERT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  const std::vector<float> plain = logits(m);
  EXPECT_FALSE(stats(m).contains("homes"));
  deltafin_model_free(m);
  const char* homes[] = {home.c_str()};
  p.homes = homes;
  p.n_homes = 1;
  ASSERT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  EXPECT_EQ(logits(m), plain);
  const json st = stats(m);
  ASSERT_TRUE(st.contains("homes")) << st.dump();
  ASSERT_EQ(st["homes"].size(), 2u);
  EXPECT_EQ(st["homes"][1]["kind"], "home");
  deltafin_model_free(m);
  p.struct_size = offsetof(deltafin_model_params, homes);  // an older caller: no homes
  ASSERT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  EXPECT_FALSE(stats(m).contains("homes"));
  deltafin_model_free(m);
  p.struct_size = sizeof p;
  p.homes = nullptr;
  EXPECT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("homes"), std::string::npos);
}

// The appended `gpu` option: a bad choice is an argument error naming it; a caller built before
// it (a smaller struct_size) runs on the CPU; "0" runs the golden model's prefill on the first
// Vulkan device (lavapipe here; the experts of a 20-row pass as grouped products) with logits
// within 2e-3 of the CPU's, and the info JSON names the device.
TEST(CApi, GpuOptionRunsTheModelOnTheDevice) {
  const std::string dir = test::data_dir() + "/k3-tiny-mxfp4/model";
  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.threads = 1;
  p.gpu = "seven";
  deltafin_model* m = nullptr;
  EXPECT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("expected auto, off or a device index"),
            std::string::npos)
      << deltafin_last_error();
  std::vector<int32_t> ids(20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(7 + 23 * i);
  auto logits = [&](deltafin_model* model) {
    std::vector<float> out(ids.size() * static_cast<size_t>(deltafin_model_vocab(model)));
    deltafin_session* s = nullptr;
    EXPECT_EQ(deltafin_session_new(model, &s), DELTAFIN_OK);
    EXPECT_EQ(deltafin_session_eval(s, ids.data(), ids.size(), 1, out.data()), DELTAFIN_OK)
        << deltafin_last_error();
    deltafin_session_free(s);
    return out;
  };
  auto gpu_of = [](deltafin_model* model) {
    char* info = nullptr;
    EXPECT_EQ(deltafin_model_info_json(model, &info), DELTAFIN_OK);
    return json::parse(take(info))["gpu"];
  };
  p.gpu = "0";
  p.struct_size = offsetof(deltafin_model_params, gpu);  // an older caller: no gpu field
  ASSERT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  EXPECT_TRUE(gpu_of(m).is_null());
  const std::vector<float> cpu = logits(m);
  deltafin_model_free(m);
  p.struct_size = sizeof p;
  const deltafin_status st = deltafin_model_load(dir.c_str(), &p, &m);
  const std::string err = st == DELTAFIN_OK ? "" : deltafin_last_error();
  if (err.find("no Vulkan") != std::string::npos ||
      err.find("no Vulkan backend") != std::string::npos)
    GTEST_SKIP() << err;
  ASSERT_EQ(st, DELTAFIN_OK) << err;
  EXPECT_EQ(gpu_of(m).get<std::string>().rfind("0: ", 0), 0u) << gpu_of(m);
  const std::vector<float> dev = logits(m);
  deltafin_model_free(m);
  ASSERT_EQ(dev.size(), cpu.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(cpu[i] - dev[i])));
  EXPECT_LE(worst, 2e-3);
  EXPECT_NE(dev, cpu);  // the device's summation order: it did run there
}

int stop_after_three(const deltafin_token_event* ev, void* user) {
  auto* seen = static_cast<std::vector<int32_t>*>(user);
  seen->push_back(ev->id);
  return ev->index >= 2 ? 1 : 0;
}

// A new session on `m` and sampling parameters of `max_new` tokens (the generation tests' start).
deltafin_session* new_session(deltafin_model* m, deltafin_sampling_params& sp, int64_t max_new) {
  deltafin_session* s = nullptr;
  EXPECT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK) << deltafin_last_error();
  deltafin_sampling_params_init(&sp);
  sp.max_new_tokens = max_new;
  return s;
}

TEST(CApi, CallbackStopsGeneration) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  const auto prompt = tokenize(m, "Hello there");
  deltafin_sampling_params sp;
  deltafin_session* s = new_session(m, sp, 50);
  ASSERT_NE(s, nullptr);
  std::vector<int32_t> seen;
  char* out = nullptr;
  ASSERT_EQ(deltafin_session_generate(s, prompt.data(), prompt.size(), &sp, stop_after_three, &seen,
                                      &out),
            DELTAFIN_OK);
  json j = json::parse(take(out));
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(j["completion_ids"].size(), 3u);
  EXPECT_EQ(j["stop_reason"], "cancelled");
  EXPECT_EQ(j["completion_ids"], json(seen));
  // The session holds prompt + the three tokens; generation continues from there.
  EXPECT_EQ(deltafin_session_position(s), static_cast<int64_t>(prompt.size() + 3));
  deltafin_session_free(s);
  deltafin_model_free(m);
}

TEST(CApi, GenerationContinuesFromThePendingToken) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  const auto prompt = tokenize(m, "Continue me");
  json whole = greedy(m, prompt, 6);
  deltafin_session* s = nullptr;
  ASSERT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK);
  deltafin_sampling_params sp;
  deltafin_sampling_params_init(&sp);
  sp.max_new_tokens = 3;
  char* out = nullptr;
  ASSERT_EQ(deltafin_session_generate(s, prompt.data(), prompt.size(), &sp, nullptr, nullptr, &out),
            DELTAFIN_OK);
  json first = json::parse(take(out));
  ASSERT_EQ(deltafin_session_generate(s, nullptr, 0, &sp, nullptr, nullptr, &out), DELTAFIN_OK)
      << deltafin_last_error();
  json second = json::parse(take(out));
  json both = first["completion_ids"];
  for (const auto& id : second["completion_ids"]) both.push_back(id);
  EXPECT_EQ(both, whole["completion_ids"]);
  int32_t* hist = nullptr;
  size_t n = 0;
  ASSERT_EQ(deltafin_session_history(s, &hist, &n), DELTAFIN_OK);
  EXPECT_EQ(n, prompt.size() + 6);
  deltafin_free(hist);
  deltafin_session_free(s);
  deltafin_model_free(m);
}

TEST(CApi, TwoModelsInOneProcessGenerateInParallel) {
  deltafin_model* a = load(tiny());
  deltafin_model* b = load(tiny());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto prompt = tokenize(a, "Two models");
  json alone = greedy(a, prompt, 8);
  json ra, rb;
  std::thread ta([&] { ra = greedy(a, prompt, 8); });
  std::thread tb([&] { rb = greedy(b, prompt, 8); });
  ta.join();
  tb.join();
  EXPECT_EQ(ra["completion_ids"], alone["completion_ids"]);
  EXPECT_EQ(rb["completion_ids"], alone["completion_ids"]);
  deltafin_model_free(a);
  // b outlives a.
  EXPECT_EQ(greedy(b, prompt, 8)["completion_ids"], alone["completion_ids"]);
  deltafin_model_free(b);
}

// Issue 31 C1: a handle freed by another thread while a call uses it. The call stops at its
// next pass with an error (never a use after free); a model freed while a session or stream made
// from it is alive stays alive for them; calls with a freed handle fail instead of reading freed
// memory. (Run under ThreadSanitizer too: `make test-tsan`.)
int signal_first(const deltafin_token_event*, void* user) {
  static_cast<std::atomic<bool>*>(user)->store(true);
  return 0;
}

TEST(CApi, FreeingAHandleInUseByAnotherThreadStopsTheCall) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  deltafin_sampling_params sp;
  deltafin_session* s = new_session(m, sp, 400);
  ASSERT_NE(s, nullptr);
  const auto prompt = tokenize(m, "Free me");
  std::atomic<bool> started{false};
  deltafin_status status = DELTAFIN_OK;
  std::string message;
  std::thread t([&] {
    char* out = nullptr;
    status = deltafin_session_generate(s, prompt.data(), prompt.size(), &sp, signal_first, &started,
                                       &out);
    message = deltafin_last_error();
    deltafin_free(out);
  });
  while (!started) std::this_thread::yield();
  deltafin_session_free(s);
  deltafin_model_free(m);  // the session's call still holds both
  t.join();
  EXPECT_EQ(status, DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(message.find("freed by another thread while it was generating"), std::string::npos)
      << message;

  // A stream outlives its freed model, and stops at its next pass.
  m = load(tiny());
  deltafin_stream* st = nullptr;
  ASSERT_EQ(
      deltafin_stream_start(m, R"({"prompt": "go", "max_tokens": 400, "temperature": 0})", 0, &st),
      DELTAFIN_OK)
      << deltafin_last_error();
  char* chunk = nullptr;
  int done = 0;
  ASSERT_EQ(deltafin_stream_next(st, &chunk, &done), DELTAFIN_OK);
  deltafin_free(chunk);
  deltafin_model_free(m);
  EXPECT_EQ(deltafin_stream_next(st, &chunk, &done), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("the model this stream belongs to was freed"),
            std::string::npos)
      << deltafin_last_error();
  deltafin_stream_free(st);
  // A freed handle (not reused) is refused, not read.
  EXPECT_EQ(deltafin_model_vocab(m), 0);
  int32_t* ids = nullptr;
  size_t n = 0;
  EXPECT_EQ(deltafin_tokenize(m, "x", 1, 0, &ids, &n), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("not a live handle"), std::string::npos);
  deltafin_model_free(m);  // freeing twice is ignored
}

int collect(const char* chunk, void* user) {
  static_cast<std::vector<json>*>(user)->push_back(json::parse(chunk));
  return 0;
}

TEST(CApi, ChatCompletionStreamsWhatItReturns) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  const char* req =
      R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0,"stream":true})";
  std::vector<json> chunks;
  char* out = nullptr;
  ASSERT_EQ(deltafin_create_chat_completion(m, req, collect, &chunks, &out), DELTAFIN_OK)
      << deltafin_last_error();
  json resp = json::parse(take(out));
  EXPECT_EQ(resp["object"], "chat.completion");
  ASSERT_GE(chunks.size(), 2u);
  std::string content, reasoning;
  for (const auto& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const auto& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
  }
  const auto& msg = resp["choices"][0]["message"];
  EXPECT_EQ(content, msg["content"].is_string() ? msg["content"].get<std::string>() : "");
  EXPECT_EQ(resp["usage"]["completion_tokens"], 12);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
  deltafin_model_free(m);
}

// One greedy chat turn of `max_tokens` through the library: its response and its stats.
std::pair<json, json> greedy_chat_turn(deltafin_chat* c, const char* text, int max_tokens) {
  deltafin_stream* s = nullptr;
  const json req = {{"content", text}, {"max_tokens", max_tokens}, {"temperature", 0}};
  EXPECT_EQ(deltafin_chat_send(c, req.dump().c_str(), &s), DELTAFIN_OK) << deltafin_last_error();
  char* out = nullptr;
  EXPECT_EQ(deltafin_stream_response(s, &out), DELTAFIN_OK);
  const json resp = json::parse(take(out));
  EXPECT_EQ(deltafin_stream_stats_json(s, &out), DELTAFIN_OK);
  const json stats = json::parse(take(out));
  deltafin_stream_free(s);
  return {resp, stats};
}

TEST(CApi, ChatTurnReusesTheKeptState) {
  deltafin_model* m = load(tiny());
  ASSERT_NE(m, nullptr);
  deltafin_chat* c = nullptr;
  ASSERT_EQ(deltafin_chat_new(m, R"({"thinking":false})", &c), DELTAFIN_OK)
      << deltafin_last_error();
  auto turn = [&](const char* text) { return greedy_chat_turn(c, text, 6); };
  auto [r1, s1] = turn("First question");
  EXPECT_EQ(s1["reused_prompt_tokens"], 0);
  auto [r2, s2] = turn("Second question");
  EXPECT_GT(s2["reused_prompt_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], s2["reused_prompt_tokens"]);
  // Only the new turn was prefilled.
  EXPECT_LT(s2["prompt_tokens"].get<int64_t>(), r2["usage"]["prompt_tokens"].get<int64_t>());
  char* hist = nullptr;
  ASSERT_EQ(deltafin_chat_history_json(c, &hist), DELTAFIN_OK);
  EXPECT_EQ(json::parse(take(hist))["messages"].size(), 4u);
  deltafin_chat_free(c);
  deltafin_model_free(m);
}

// A K2-family model through the library: `make-model --preset k2` (the release's MLA and FP8
// layout, shrunk), greedy generation equal to the CLI's, and a chat in K2-Instruct's format whose
// second turn continues from the kept state and prefills only the new turn.
TEST(CApi, AK2ModelGeneratesAsTheCliAndKeepsItsChatState) {
  // The K2 make-model the K2Release and DeepseekV3Preset tests share.
  const std::string dir =
      test::shared_model({"--preset", "k2", "--layers", "3", "--experts", "16", "--top-k", "4",
                          "--hidden", "256", "--vocab", "512", "--shard-size", "16M", "--quiet"});
  deltafin_model* m = load(dir, 2);
  ASSERT_NE(m, nullptr);
  const auto prompt = tokenize(m, "The weather in Paris");
  ASSERT_FALSE(prompt.empty());
  const json j = greedy(m, prompt, 8);
  auto r = test::run_deltafin({"run", "--json", "--model", dir, "--prompt", "The weather in Paris",
                               "--max-new", "8", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json cli = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], cli["prompt_ids"]);
  EXPECT_EQ(j["completion_ids"], cli["completion_ids"]);
  EXPECT_EQ(j["completion_tokens"], 8);

  deltafin_chat* c = nullptr;
  ASSERT_EQ(deltafin_chat_new(m, R"({"thinking":false})", &c), DELTAFIN_OK)
      << deltafin_last_error();
  auto turn = [&](const char* text) { return greedy_chat_turn(c, text, 4); };
  const auto [r1, s1] = turn("First question");
  EXPECT_EQ(s1["reused_prompt_tokens"], 0);
  const auto [r2, s2] = turn("Second question");
  const int64_t reused = s2["reused_prompt_tokens"].get<int64_t>();
  // At least the whole first prompt but its generation prompt (<|im_assistant|>assistant
  // <|im_middle|>) came from the kept state.
  const std::string gen_text = "<|im_assistant|>assistant<|im_middle|>";
  int32_t* gen_ids = nullptr;
  size_t gen = 0;
  ASSERT_EQ(deltafin_tokenize(m, gen_text.data(), gen_text.size(), 1, &gen_ids, &gen), DELTAFIN_OK);
  deltafin_free(gen_ids);
  EXPECT_LT(gen, gen_text.size());  // the markers are special tokens of this tokenizer
  EXPECT_GE(reused, r1["usage"]["prompt_tokens"].get<int64_t>() - static_cast<int64_t>(gen));
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], reused);
  EXPECT_LT(s2["prompt_tokens"].get<int64_t>(), r2["usage"]["prompt_tokens"].get<int64_t>());
  char* hist = nullptr;
  ASSERT_EQ(deltafin_chat_history_json(c, &hist), DELTAFIN_OK);
  EXPECT_EQ(json::parse(take(hist))["messages"].size(), 4u);
  deltafin_chat_free(c);
  deltafin_model_free(m);
}

// max_rows 0 (the default) lets the plan size prefill passes from the budget, as the CLI's
// --prefill-chunk auto: a prompt of the whole context is one pass; generation takes the model's
// pass rows by default, and its logits are those of a model planned for 16-row passes.
TEST(CApi, PrefillPassesAreSizedByThePlanByDefault) {
  deltafin_model* a = load(tiny());
  ASSERT_NE(a, nullptr);
  char* out = nullptr;
  ASSERT_EQ(deltafin_model_memory_plan_json(a, &out), DELTAFIN_OK);
  const json plan = json::parse(take(out));
  EXPECT_EQ(plan["pass_rows_auto"], true) << plan.dump();
  EXPECT_EQ(plan["pass_rows"], 512) << "the planned context (512) fits the 1 GiB budget";

  deltafin_model_params p;
  deltafin_model_params_init(&p);
  EXPECT_EQ(p.max_rows, 0);
  p.threads = 1;
  p.memory_budget = 1ull << 30;
  p.ctx = 512;
  p.max_rows = 16;
  deltafin_model* b = nullptr;
  ASSERT_EQ(deltafin_model_load(tiny().c_str(), &p, &b), DELTAFIN_OK) << deltafin_last_error();
  ASSERT_EQ(deltafin_model_memory_plan_json(b, &out), DELTAFIN_OK);
  const json fixed = json::parse(take(out));
  EXPECT_EQ(fixed["pass_rows_auto"], false);
  EXPECT_EQ(fixed["pass_rows"], 16);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i * 7 % 400);
  const json ja = greedy(a, prompt, 6), jb = greedy(b, prompt, 6);
  EXPECT_EQ(ja["completion_ids"], jb["completion_ids"]);
  // 100 prompt rows: one pass with the planned 512 rows, seven of 16; decoding is the same.
  EXPECT_EQ(jb["passes"].get<int64_t>() - ja["passes"].get<int64_t>(), 6) << ja.dump() << jb.dump();

  p.max_rows = -1;
  deltafin_model* c = nullptr;
  EXPECT_EQ(deltafin_model_load(tiny().c_str(), &p, &c), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("max_rows"), std::string::npos);
  deltafin_sampling_params sp;
  deltafin_sampling_params_init(&sp);
  EXPECT_EQ(sp.prefill_chunk, 0);
  sp.prefill_chunk = -2;
  deltafin_session* s = nullptr;
  ASSERT_EQ(deltafin_session_new(a, &s), DELTAFIN_OK);
  EXPECT_EQ(deltafin_session_generate(s, prompt.data(), prompt.size(), &sp, nullptr, nullptr, &out),
            DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("prefill_chunk"), std::string::npos);
  deltafin_session_free(s);
  deltafin_model_free(b);
  deltafin_model_free(a);
}

TEST(CApi, ErrorsAreStatusesWithMessages) {
  deltafin_model* m = nullptr;
  EXPECT_EQ(deltafin_model_load("/nonexistent/k3", nullptr, &m), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("/nonexistent/k3"), std::string::npos);
  EXPECT_EQ(m, nullptr);
  EXPECT_EQ(deltafin_model_load(nullptr, nullptr, &m), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("path"), std::string::npos);

  // A corrupt checkpoint: config.json that is not JSON.
  const std::string bad = test::temp_dir("capi-bad");
  test::spit(bad + "/config.json", "{not json");
  EXPECT_NE(deltafin_model_load(bad.c_str(), nullptr, &m), DELTAFIN_OK);
  EXPECT_NE(std::string(deltafin_last_error()).find("config.json"), std::string::npos)
      << deltafin_last_error();

  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.trunk = "fp8";
  EXPECT_EQ(deltafin_model_load(tiny().c_str(), &p, &m), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("fp8"), std::string::npos);

  m = load(tiny());
  ASSERT_NE(m, nullptr);
  char* out = nullptr;
  EXPECT_EQ(deltafin_create_completion(m, "{bad", nullptr, nullptr, &out), DELTAFIN_ERR_ARGUMENT);
  EXPECT_EQ(
      deltafin_create_completion(m, R"({"prompt":"x","frobnicate":1})", nullptr, nullptr, &out),
      DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("frobnicate"), std::string::npos);
  // A prompt longer than the context (512 planned).
  json big = {{"prompt", std::vector<int>(600, 65)}};
  EXPECT_EQ(deltafin_create_completion(m, big.dump().c_str(), nullptr, nullptr, &out),
            DELTAFIN_ERR_CONTEXT);
  EXPECT_NE(std::string(deltafin_last_error()).find("context"), std::string::npos);
  // Out-of-range ids.
  deltafin_session* s = nullptr;
  ASSERT_EQ(deltafin_session_new(m, &s), DELTAFIN_OK);
  const int32_t ids[] = {1, -4};
  EXPECT_EQ(deltafin_session_eval(s, ids, 2, 0, nullptr), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("-4"), std::string::npos);
  deltafin_session_free(s);
  // A chat takes one turn at a time.
  deltafin_chat* c = nullptr;
  ASSERT_EQ(deltafin_chat_new(m, nullptr, &c), DELTAFIN_OK);
  deltafin_stream* t1 = nullptr;
  deltafin_stream* t2 = nullptr;
  ASSERT_EQ(deltafin_chat_send(c, R"({"content":"a","max_tokens":2})", &t1), DELTAFIN_OK);
  EXPECT_EQ(deltafin_chat_send(c, R"({"content":"b"})", &t2), DELTAFIN_ERR_ARGUMENT);
  deltafin_stream_free(t1);
  EXPECT_EQ(deltafin_chat_send(c, R"({"content":"b","max_tokens":2})", &t2), DELTAFIN_OK)
      << deltafin_last_error();
  deltafin_stream_free(t2);
  // A conversation that outgrows the context is refused, and the chat is as it was. (The turns
  // above were cancelled at once; they are kept with their exact ids, so it takes a long turn.)
  const std::string long_turn = json{{"content", std::string(4000, 'c')}, {"max_tokens", 2}}.dump();
  EXPECT_EQ(deltafin_chat_send(c, long_turn.c_str(), &t1), DELTAFIN_ERR_CONTEXT);
  EXPECT_NE(std::string(deltafin_last_error()).find("context is 512 tokens"), std::string::npos);
  char* hist = nullptr;
  ASSERT_EQ(deltafin_chat_history_json(c, &hist), DELTAFIN_OK);
  EXPECT_EQ(json::parse(take(hist))["messages"].size(), 4u);
  deltafin_chat_free(c);
  // A turn's stream that outlives its chat fails cleanly.
  ASSERT_EQ(deltafin_chat_new(m, R"({"thinking":false})", &c), DELTAFIN_OK);
  ASSERT_EQ(deltafin_chat_send(c, R"({"content":"c","max_tokens":2})", &t1), DELTAFIN_OK)
      << deltafin_last_error();
  deltafin_chat_free(c);
  char* chunk = nullptr;
  int done = 0;
  EXPECT_EQ(deltafin_stream_next(t1, &chunk, &done), DELTAFIN_OK);  // the role chunk
  deltafin_free(chunk);
  EXPECT_EQ(deltafin_stream_next(t1, &chunk, &done), DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("chat"), std::string::npos);
  deltafin_stream_free(t1);
  deltafin_model_free(m);
}

}  // namespace
}  // namespace deltafin

namespace deltafin {
namespace {

// The C API loads through the same path as the CLI: a draft model folder is opened once and
// counted in the memory plan (its weights, and its cache for every planned sequence), so under
// the same budget the expert cache shrinks by what the drafter takes. It then drafts.
TEST(CApi, ADraftModelIsCountedInTheMemoryPlan) {
  const std::string draft = test::temp_dir("capi_draft") + "/draft";
  auto made = test::run_deltafin(
      {"make-model", draft, "--drafter", "eagle3.1", "--target", tiny(), "--quiet"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  auto plan_of = [](const char* spec, deltafin_model** out) {
    deltafin_model_params p;
    deltafin_model_params_init(&p);
    p.threads = 1;
    p.memory_budget = 46ull << 20;  // the expert cache holds only part of the experts
    p.ctx = 512;
    p.draft = spec;
    p.draft_max = 4;
    EXPECT_EQ(deltafin_model_load(tiny().c_str(), &p, out), DELTAFIN_OK) << deltafin_last_error();
    char* text = nullptr;
    EXPECT_EQ(deltafin_model_memory_plan_json(*out, &text), DELTAFIN_OK);
    return json::parse(take(text));
  };
  deltafin_model* plain = nullptr;
  deltafin_model* drafted = nullptr;
  const json a = plan_of("none", &plain);
  const json b = plan_of(draft.c_str(), &drafted);
  ASSERT_NE(drafted, nullptr);
  EXPECT_EQ(a["draft_weight_bytes"], 0);
  EXPECT_GT(b["draft_weight_bytes"].get<uint64_t>(), 0u) << b.dump();
  EXPECT_GT(b["draft_cache_bytes"].get<uint64_t>(), 0u) << b.dump();
  // The drafter is part of the fixed cost (the rest of it is the same; the stream buffers follow
  // the trunk's residency), and the plan still fits the budget: the expert cache and the
  // resident trunk gave up what the drafter takes.
  auto u = [](const json& j, const char* k) { return j[k].get<uint64_t>(); };
  EXPECT_EQ(u(b, "fixed_bytes") - u(b, "buffer_bytes") - u(b, "draft_weight_bytes") -
                u(b, "draft_cache_bytes"),
            u(a, "fixed_bytes") - u(a, "buffer_bytes"))
      << a.dump() << "\n"
      << b.dump();
  for (const json* j : {&a, &b}) {
    EXPECT_LE(u(*j, "fixed_bytes") + u(*j, "expert_cache_bytes") + u(*j, "trunk_resident_bytes"),
              u(*j, "budget"))
        << j->dump();
  }
  EXPECT_LT(u(b, "expert_cache_bytes") + u(b, "trunk_resident_bytes"),
            u(a, "expert_cache_bytes") + u(a, "trunk_resident_bytes"));
  EXPECT_NE(b["describe"].get<std::string>().find("draft model"), std::string::npos);
  // And the drafter drafts (a greedy generation through the C API).
  std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12};
  const json ja = greedy(plain, prompt, 12), jb = greedy(drafted, prompt, 12);
  EXPECT_EQ(ja["completion_ids"], jb["completion_ids"]);
  EXPECT_GT(jb["draft_proposed"].get<int64_t>(), 0) << jb.dump();
  deltafin_model_free(plain);
  deltafin_model_free(drafted);
}

// More threads than CPUs are capped as the CLI caps --threads (with a warning), never an
// abort: a model asked for 100000 threads loads and computes the same tokens.
TEST(CApi, ThreadsBeyondTheCpusAreCapped) {
  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.threads = 100000;
  p.memory_budget = 1ull << 30;
  p.ctx = 512;
  deltafin_model* m = nullptr;
  ASSERT_EQ(deltafin_model_load(tiny().c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  deltafin_model* one = load(tiny());
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  EXPECT_EQ(greedy(m, prompt, 4)["completion_ids"], greedy(one, prompt, 4)["completion_ids"]);
  deltafin_model_free(m);
  deltafin_model_free(one);
}

}  // namespace
}  // namespace deltafin
