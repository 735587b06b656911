// The Anthropic Messages, OpenAI Responses and Ollama APIs through the real `deltafin serve`:
// each API's own error shape and key header, the Anthropic `ping` during a slow prefill, the
// token routes, and then the real clients, installed from npm by their lockfiles and
// unmodified (tests/api_clients: @anthropic-ai/sdk, openai's Responses, ollama;
// tests/agent_clients: Claude Code in print mode and Codex exec). The node scripts check the
// shapes the way each client reads them; here only their exit status matters. Images: every
// client sends a real photo to `serve` started with no --model (the built-in demo, whose random
// vision tower takes images by default), and the agents send one too; the scripts check that the
// image reached the prompt through the server's /metrics image counters, not only that a
// client got an answer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/vision_encoder.h"
#include "fixtures/synthetic.h"
#include "server_util.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

bool have_node() {
  return std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") == 0;
}

// Scoped environment variable for a server started in this scope.
struct Env {
  Env(const char* k, const std::string& v) : key(k) { setenv(k, v.c_str(), 1); }
  ~Env() { unsetenv(key); }
  const char* key;
};

json body_of(const HttpResult& r) {
  return json::parse(r.body, nullptr, false);
}

TEST(ServerApis, KeysAndErrorShapesPerApi) {
  ServerProcess srv({"--api-key", "sk-test", "--max-tokens", "2"});
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client(60);
  const json msg = {{"model", "kimi-k3"},
                    {"max_tokens", 2},
                    {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  // Anthropic: x-api-key (what its SDK sends) or a bearer token; errors in its envelope.
  auto none = post_json(*c, "/v1/messages", msg);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(body_of(none)["type"], "error");
  EXPECT_EQ(body_of(none)["error"]["type"], "authentication_error");
  EXPECT_NE(body_of(none)["error"]["message"].get<std::string>().find("x-api-key"),
            std::string::npos);
  EXPECT_EQ(post_json(*c, "/v1/messages", msg, {{"x-api-key", "wrong"}}).status, 401);
  EXPECT_EQ(post_json(*c, "/v1/messages", msg, {{"x-api-key", "sk-test"}}).status, 200);
  EXPECT_EQ(post_json(*c, "/v1/messages", msg, {{"Authorization", "Bearer sk-test"}}).status, 200);
  auto bad = post_json(*c, "/v1/messages", json{{"model", "kimi-k3"}}, {{"x-api-key", "sk-test"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(body_of(bad)["error"]["type"], "invalid_request_error") << bad.body;
  // anthropic-version / anthropic-beta headers and ?beta=true (Claude Code) are accepted.
  EXPECT_EQ(post_json(*c, "/v1/messages?beta=true", msg,
                      {{"x-api-key", "sk-test"},
                       {"anthropic-version", "2023-06-01"},
                       {"anthropic-beta", "interleaved-thinking-2025-05-14"}})
                .status,
            200);
  // Responses: OpenAI's shape.
  const json resp = {{"model", "kimi-k3"}, {"input", "hi"}};
  auto r401 = post_json(*c, "/v1/responses", resp);
  EXPECT_EQ(r401.status, 401);
  EXPECT_TRUE(is_error_shape(body_of(r401))) << r401.body;
  EXPECT_EQ(post_json(*c, "/v1/responses", resp, {{"Authorization", "Bearer sk-test"}}).status,
            200);
  // Ollama: {"error": "..."}.
  auto o401 = get(*c, "/api/tags");
  EXPECT_EQ(o401.status, 401);
  EXPECT_TRUE(body_of(o401)["error"].is_string()) << o401.body;
  EXPECT_EQ(get(*c, "/api/tags", {{"Authorization", "Bearer sk-test"}}).status, 200);
  auto o404 = post_json(*c, "/api/chat", json{{"model", "nope"}, {"messages", json::array()}},
                        {{"Authorization", "Bearer sk-test"}});
  EXPECT_EQ(o404.status, 404);
  EXPECT_TRUE(body_of(o404)["error"].is_string()) << o404.body;
  auto o405 = get(*c, "/api/chat", {{"Authorization", "Bearer sk-test"}});
  EXPECT_EQ(o405.status, 405);
  EXPECT_TRUE(body_of(o405)["error"].is_string()) << o405.body;
  // Tokens.
  auto t =
      post_json(*c, "/tokenize", json{{"content", "hello"}}, {{"Authorization", "Bearer sk-test"}});
  ASSERT_EQ(t.status, 200) << t.body;
  auto d = post_json(*c, "/detokenize", json{{"tokens", body_of(t)["tokens"]}},
                     {{"Authorization", "Bearer sk-test"}});
  EXPECT_EQ(body_of(d)["content"], "hello");
  EXPECT_EQ(srv.stop(), 0);
}

TEST(ServerApis, AnthropicPingsDuringASlowPrefill) {
  Env slow("DELTAFIN_DEBUG_STEP_DELAY_MS", "11000");  // one step is longer than the 10 s silence
  ServerProcess srv({});
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client(60);
  auto r = post_json(*c, "/v1/messages",
                     {{"model", "kimi-k3"},
                      {"max_tokens", 1},
                      {"stream", true},
                      {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t start = r.body.find("event: message_start");
  const size_t ping = r.body.find("event: ping\ndata: {\"type\":\"ping\"}\n\n");
  const size_t block = r.body.find("event: content_block_start");
  ASSERT_NE(ping, std::string::npos) << r.body;
  EXPECT_LT(start, ping);
  EXPECT_LT(ping, block);
  EXPECT_NE(r.body.find("event: message_stop"), std::string::npos);
  EXPECT_EQ(srv.stop(), 0);
}

// Runs `node SCRIPT` in tests/DIR against `srv` (with its key, and `env` more variables) and
// expects it to pass.
void run_script(ServerProcess& srv, const char* dir, const char* package, const char* script,
                const std::string& env = "") {
  ASSERT_TRUE(srv.ready()) << srv.err();
  std::string out;
  int code = -1;
  ASSERT_TRUE(run_node_test(
      dir, package, "DELTAFIN_BASE_URL=" + srv.base_url() + " DELTAFIN_API_KEY=sk-test " + env,
      script, out, code))
      << out;
  EXPECT_EQ(code, 0) << out << "\n" << srv.err();
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  EXPECT_EQ(srv.stop(), 0);
}

void run_clients(const char* script) {
  if (!have_node()) GTEST_SKIP() << "node/npm not installed";
  ServerProcess srv({"--api-key", "sk-test"});
  run_script(srv, "api_clients", "@anthropic-ai/sdk", script);
}

TEST(ServerClients, AnthropicSdk) {
  run_clients("anthropic_test.mjs");
}

TEST(ServerClients, OpenAiResponses) {
  run_clients("responses_test.mjs");
}

TEST(ServerClients, OllamaLibrary) {
  run_clients("ollama_test.mjs");
}

// The <|media_pad|> tokens `image` (a file of tests/data/vision) takes with the vision tower of
// the model in `dir` (its preprocessor's patch limits), for the scripts to check the server's
// count against.
int64_t image_tokens_for(const std::string& dir, const std::string& image) {
  const std::string bytes = slurp(data_dir() + "/vision/" + image);
  const auto enc = VisionEncoder::open(dir);
  return enc
      ->plan(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
             image)
      .num_tokens;
}

// OpenAI chat (image_url data URL), Responses (input_image), Anthropic (base64 image block) and
// Ollama (images) send tests/data/vision/photo.jpg (640x427, resized by the demo's preprocessor)
// to `deltafin serve` with no --model: the built-in demo answers each.
TEST(ServerClients, ImagesFromEveryClientToTheDemo) {
  if (!have_node()) GTEST_SKIP() << "node/npm not installed";
  const std::string demo = demo_model_dir();  // installs it into a cache of the test's own
  const int64_t tokens = image_tokens_for(demo, "photo.jpg");
  ASSERT_GT(tokens, 16);
  Env cache("DELTAFIN_CACHE", std::filesystem::path(demo).parent_path().string());
  const char* model_env = std::getenv("DELTAFIN_MODEL");
  const std::string saved_model = model_env != nullptr ? model_env : "";
  unsetenv("DELTAFIN_MODEL");
  {
    ServerProcess srv({"--api-key", "sk-test"}, ServerProcess::kNoModel);
    ASSERT_TRUE(srv.ready()) << srv.err();
    EXPECT_NE(srv.err().find("using the built-in demo"), std::string::npos) << srv.err();
    run_script(srv, "api_clients", "openai", "images_test.mjs",
               "DELTAFIN_IMAGE=" + data_dir() +
                   "/vision/photo.jpg DELTAFIN_IMAGE_TOKENS=" + std::to_string(tokens));
  }
  if (!saved_model.empty()) setenv("DELTAFIN_MODEL", saved_model.c_str(), 1);
}

// A model cheap enough to prefill the agents' prompts (tens of thousands of tokens with the
// byte-level test vocabulary) and with a context that holds them: the tiny shape cut to two
// layers of four 64-wide experts, max_position_embeddings 65536, with the tiny vision tower so
// that the agents' images run too.
const std::string& long_context_model() {
  static const std::string dir = [] {
    const std::string d = temp_dir("agents-model") + "/model";
    SyntheticSpec spec = synthetic_preset("tiny");
    spec.layers = 2;
    spec.experts = 4;
    spec.top_k = 1;
    spec.hidden = 64;
    spec.max_positions = 65536;
    spec.vision = synthetic_vision_preset("tiny");
    make_model(d, spec);
    return d;
  }();
  return dir;
}

// Claude Code and Codex complete a turn: the model is scripted (DELTAFIN_DEBUG_SCRIPT) to think,
// answer and end its turn, since a random model would never end one and both agents then retry
// or fail.
// With `image`, the agent attaches tests/data/vision/photo.jpg and the script checks the
// server's image counters.
void run_agent(const char* agent, bool image = false) {
  if (!have_node()) GTEST_SKIP() << "node/npm not installed";
  const std::string answer = "Hello from Deltafin.";
  Env script("DELTAFIN_DEBUG_SCRIPT", "Greeting.<|close|>think<|sep|><|open|>response<|sep|>" +
                                          answer +
                                          "<|close|>response<|sep|><|close|>message<|sep|>"
                                          "<|end_of_msg|>");
  ServerProcess srv({"--api-key", "sk-test", "--ctx", "65536", "--threads", "2"},
                    long_context_model());
  std::string env = std::string("DELTAFIN_AGENT=") + agent + " DELTAFIN_EXPECT='" + answer + "'";
  if (image) {
    env += " DELTAFIN_IMAGE=" + data_dir() + "/vision/photo.jpg DELTAFIN_IMAGE_TOKENS=" +
           std::to_string(image_tokens_for(long_context_model(), "photo.jpg"));
  }
  run_script(srv, "agent_clients", "@openai/codex", "agents_test.mjs", env);
}

TEST(ServerClients, ClaudeCodePrintMode) {
  run_agent("claude");
}

TEST(ServerClients, CodexExec) {
  run_agent("codex");
}

TEST(ServerClients, ClaudeCodeStreamJsonWithAnImage) {
  run_agent("claude", true);
}

TEST(ServerClients, CodexExecWithAnImage) {
  run_agent("codex", true);
}

}  // namespace
}  // namespace deltafin::test
