// Unit tests of the server's parts that the tiny random model cannot exercise end to end: the
// mapping of K3 tool calls to OpenAI `tool_calls` (streamed and whole), driven through a real
// Generation with forced logits on K3-formatted output encoded by the real K3 tokenizer; the
// segment-equality rule of the conversation cache; and request validation details.
#include <gtest/gtest.h>

#include <limits>

#include "server/api_error.h"
#include "server/request.h"
#include "server/response.h"
#include "server_util.h"
#include "test_util.h"
#include "tokenizer/chat.h"

namespace deltafin::server {
namespace {

using json = nlohmann::ordered_json;

const Tokenizer& k3() {
  return test::k3_tokenizer();
}

ServeLimits limits() {
  return test::k3_limits(4096, 4096);
}

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});

json weather_request() {
  return {
      {"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris and Rome?"}}})},
      {"tools", kTools},
      {"reasoning_effort", "medium"},
      {"max_tokens", 200},
      {"temperature", 0}};
}

// What the model "writes": two calls, typed arguments.
const std::string kModelOutput =
    "The user wants two cities.<|close|>think<|sep|><|open|>response<|sep|>Let me "
    "check.<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" "
    "type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"2\"<|sep|>"
    "<|open|>argument key=\"city\" "
    "type=\"string\"<|sep|>Rome<|close|>argument<|sep|><|close|>call<|sep|>"
    "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

struct Driven {
  std::vector<json> chunks;
  json response;
  std::vector<int32_t> prompt, generated;
  ServeRequest req;
  std::unique_ptr<ResponseBuilder> builder;
};

// Runs a Generation the way the engine does, with logits that force `output`'s ids.
Driven drive(const json& body, const std::string& output, bool logprobs = false) {
  Driven d;
  d.req = parse_chat_request(body, limits(), k3());
  d.req.params.top_logprobs = logprobs ? 2 : -1;
  d.prompt = d.req.prompt;
  Generation g(d.prompt, d.req.params, &k3(), k3().vocab_size());
  d.builder = std::make_unique<ResponseBuilder>(k3(), Endpoint::chat, "chatcmpl-test", 1, "kimi-k3",
                                                logprobs, true);
  for (auto& c : d.builder->begin()) d.chunks.push_back(c);
  test::force_output(g, output, [&](const StepUpdate& u) {
    for (auto& c : d.builder->add(u)) d.chunks.push_back(c);
  });
  d.generated = g.completion_ids();
  Usage usage{static_cast<int64_t>(d.prompt.size()), 0, static_cast<int64_t>(d.generated.size())};
  for (auto& c : d.builder->end(g.stop_reason(), usage)) d.chunks.push_back(c);
  d.response = d.builder->response(g.stop_reason(), usage);
  return d;
}

// The scheduler's thread hands ApiError copies to connection threads: a copy must own its
// message (std::runtime_error's copies would share one reference-counted string; see api_error.h).
TEST(ServerResponse, ApiErrorCopiesOwnTheirMessage) {
  const server::ApiError e(429, "the queue is full", "rate_limit_error", std::nullopt,
                           "queue_full");
  const server::ApiError copy(e);
  EXPECT_STREQ(copy.what(), e.what());
  EXPECT_NE(static_cast<const void*>(copy.what()), static_cast<const void*>(e.what()));
  server::ApiError assigned(500, "x", "server_error");
  assigned = e;
  EXPECT_STREQ(assigned.what(), "the queue is full");
  EXPECT_NE(static_cast<const void*>(assigned.what()), static_cast<const void*>(e.what()));
  EXPECT_EQ(assigned.status(), 429);
  EXPECT_EQ(assigned.code(), std::optional<std::string>("queue_full"));
  EXPECT_EQ(copy.to_json(), e.to_json());
}

TEST(ServerResponse, ToolCallsFromK3Output) {
  Driven d = drive(weather_request(), kModelOutput);
  EXPECT_EQ(d.generated, k3().encode_with_special(kModelOutput));
  const json& choice = d.response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& m = choice["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], "Let me check.");
  EXPECT_EQ(m["reasoning_content"], "The user wants two cities.");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  const json& c0 = m["tool_calls"][0];
  EXPECT_EQ(c0["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(c0["type"], "function");
  EXPECT_EQ(c0["function"]["name"], "get_weather");
  ASSERT_TRUE(c0["function"]["arguments"].is_string());  // a JSON string, as OpenAI sends it
  EXPECT_EQ(json::parse(c0["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], "{\"city\":\"Rome\"}");
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);

  // Streamed: role first; each call begins with index, id, type and name; argument fragments
  // concatenate to the same strings; one finish_reason; the usage chunk last.
  ASSERT_GE(d.chunks.size(), 4u);
  EXPECT_EQ(d.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, reasoning;
  std::vector<std::string> args(2), ids(2);
  int finishes = 0;
  for (const auto& c : d.chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], "chatcmpl-test");
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    const json& delta = ch["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("reasoning_content"))
      reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("tool_calls")) {
      for (const auto& tc : delta["tool_calls"]) {
        const size_t i = tc["index"];
        ASSERT_LT(i, 2u);
        if (tc.contains("id")) {
          EXPECT_TRUE(ids[i].empty());
          EXPECT_TRUE(args[i].empty());
          ids[i] = tc["id"];
          EXPECT_EQ(tc["type"], "function");
          EXPECT_EQ(tc["function"]["name"], "get_weather");
        } else {
          EXPECT_FALSE(ids[i].empty());  // a fragment of a call that has begun
        }
        args[i] += tc["function"]["arguments"].get<std::string>();
      }
    }
    if (!ch["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(ch["finish_reason"], "tool_calls");
    }
  }
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(reasoning, "The user wants two cities.");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ids[i], m["tool_calls"][i]["id"]);
    EXPECT_EQ(args[i], m["tool_calls"][i]["function"]["arguments"]);
  }
  EXPECT_TRUE(d.chunks.back()["choices"].empty());
  EXPECT_EQ(d.chunks.back()["usage"]["completion_tokens"],
            static_cast<int64_t>(d.generated.size()));
}

TEST(ServerResponse, ToolRoundTripRendersAndKeepsTheState) {
  Driven d = drive(weather_request(), kModelOutput);
  // The client sends the answer back with the tools' results.
  json next = weather_request();
  json answer = d.response["choices"][0]["message"];
  answer.erase("refusal");
  next["messages"].push_back(answer);
  for (size_t i = 0; i < 2; ++i) {
    next["messages"].push_back({{"role", "tool"},
                                {"tool_call_id", answer["tool_calls"][i]["id"]},
                                {"content", i == 0 ? "sunny" : "rain"}});
  }
  ServeRequest r = parse_chat_request(next, limits(), k3());
  const std::string text = k3().decode(r.prompt);
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>sunny"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("index=\"2\"<|sep|>rain"), std::string::npos);
  // The next prompt starts with the first one's messages: the snapshot kept at their end
  // (prefix/reuse.h) continues it, whatever the answer re-renders to.
  ASSERT_GT(d.req.messages_end, 0);
  EXPECT_TRUE(std::equal(d.req.prompt.begin(), d.req.prompt.begin() + d.req.messages_end,
                         r.prompt.begin()));
  EXPECT_LT(d.req.messages_end, static_cast<int64_t>(d.req.prompt.size()));  // generation prompt
}

TEST(ServerResponse, LogprobsAndLengthStop) {
  json body = weather_request();
  body["max_tokens"] = 5;
  Driven d = drive(body, "Thinking hard about it, then answering carefully.", true);
  const json& choice = d.response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  const json& lp = choice["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 5u);
  std::string joined;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp[i]["token"], std::string(k3().token_bytes(d.generated[i])));
    EXPECT_EQ(lp[i]["top_logprobs"][0]["token"], lp[i]["token"]);
    EXPECT_EQ(lp[i]["top_logprobs"].size(), 2u);
    joined += lp[i]["token"].get<std::string>();
  }
  EXPECT_EQ(joined, choice["message"]["reasoning_content"]);
}

TEST(ServerResponse, FinishReasons) {
  EXPECT_EQ(finish_reason(StopReason::kLength, false), "length");
  EXPECT_EQ(finish_reason(StopReason::kContext, true), "length");
  EXPECT_EQ(finish_reason(StopReason::kEndOfTurn, false), "stop");
  EXPECT_EQ(finish_reason(StopReason::kStopString, false), "stop");
  EXPECT_EQ(finish_reason(StopReason::kEndOfTurn, true), "tool_calls");
}

TEST(ServerRequest, ValidationDetails) {
  // Effort mapping: minimal -> low, medium -> high.
  for (auto [given, rendered] :
       {std::pair{"minimal", "low"}, std::pair{"medium", "high"}, std::pair{"max", "max"}}) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
              {"reasoning_effort", given}};
    const auto r = parse_chat_request(b, limits(), k3());
    EXPECT_NE(k3().decode(r.prompt).find(std::string("thinking_effort=") + rendered + "`"),
              std::string::npos)
        << given;
    EXPECT_EQ(r.params.start_channel, Channel::think);
  }
  json off = {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
              {"thinking", false}};
  auto r = parse_chat_request(off, limits(), k3());
  EXPECT_EQ(r.params.start_channel, Channel::response);
  EXPECT_EQ(k3().decode(r.prompt).find("thinking_effort"), std::string::npos);
  off.erase("thinking");
  off["chat_template_kwargs"] = {{"thinking", false}};
  EXPECT_EQ(parse_chat_request(off, limits(), k3()).params.start_channel, Channel::response);
  // Defaults: OpenAI's temperature 1, max_tokens = the ceiling for chat, 16 for completions.
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_EQ(r.params.max_new_tokens, 4096);
  auto c = parse_completion_request({{"prompt", "x"}}, limits(), k3());
  EXPECT_EQ(c.params.max_new_tokens, 16);
  EXPECT_FALSE(c.params.chat);
  // A seed of any 64-bit integer; an int like 5.0 is an int.
  auto s = parse_completion_request({{"prompt", "x"}, {"seed", -1}, {"max_tokens", 5.0}}, limits(),
                                    k3());
  EXPECT_TRUE(s.params.sampling.has_seed);
  EXPECT_EQ(s.params.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(s.params.max_new_tokens, 5);
  // Depth is checked before parsing; strings may hold brackets.
  EXPECT_NO_THROW(parse_body("{\"a\":\"" + std::string(500, '[') + "\"}", 8));
  EXPECT_THROW(parse_body(std::string(9, '[') + std::string(9, ']'), 8), ApiError);
  try {
    parse_chat_request(
        {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"temperature", -1}},
        limits(), k3());
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "temperature");
    EXPECT_TRUE(e.to_json()["error"]["code"].is_null());
  }
}

}  // namespace
}  // namespace deltafin::server
