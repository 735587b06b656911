// The Anthropic Messages, OpenAI Responses and Ollama translations (src/server/*_api.*), driven
// as the engine drives them but without a model: each body is translated, its prompt compared
// with the equivalent Chat Completions conversation's (same token ids), and a real Generation is
// forced through K3-formatted output (thinking, text, tool calls, stop strings) so every wire's
// events, blocks and items can be checked. The real clients' view of the same wires is in
// api_clients_test.cpp.
#include <gtest/gtest.h>

#include "server/anthropic_api.h"
#include "server/ollama_api.h"
#include "server/responses_api.h"
#include "server/tokens_api.h"
#include "server/wire.h"
#include "server_util.h"
#include "test_util.h"

namespace deltafin::server {
namespace {

using json = nlohmann::ordered_json;

constexpr auto k3 = &test::k3_tokenizer;

ServeLimits limits() {
  return test::k3_limits(8192, 4096);
}

const std::string kThinkTextTool =
    "Paris, then.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
    "<|close|>call<|sep|><|open|>call tool=\"get_weather\" index=\"2\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Rome<|close|>argument<|sep|>"
    "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

struct Driven {
  std::string stream;  // the streamed bytes
  json response;       // the non-streamed body
  Outcome outcome;
};

// Forces `output` through a Generation of `t.request` and feeds both a streaming and a
// non-streaming use of `t.wire` (the same Wire object: add() once, then end() and response()).
Driven drive(Translation t, const std::string& output) {
  Driven d;
  Generation g(t.request.prompt, t.request.params, &k3(), k3().vocab_size());
  d.stream += t.wire->begin();
  test::force_output(g, output, [&](const StepUpdate& u) { d.stream += t.wire->add(u); });
  d.outcome.stop = g.stop_reason();
  d.outcome.stop_string = g.stop_string();
  d.outcome.usage = {static_cast<int64_t>(t.request.prompt.size()), 3,
                     static_cast<int64_t>(g.tokens().size())};
  d.stream += t.wire->end(d.outcome);
  d.response = t.wire->response(d.outcome);
  return d;
}

// "event: NAME\ndata: JSON\n\n" frames -> (name, data).
std::vector<std::pair<std::string, json>> sse_frames(const std::string& s) {
  std::vector<std::pair<std::string, json>> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << s.substr(at);
    if (end == std::string::npos) break;
    const std::string frame = s.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    const size_t nl = frame.find('\n');
    const std::string name = frame.substr(7, nl - 7);
    EXPECT_EQ(frame.compare(nl + 1, 6, "data: "), 0) << frame;
    out.emplace_back(name, json::parse(frame.substr(nl + 7)));
    EXPECT_EQ(out.back().second["type"], name) << frame;
  }
  return out;
}

const json kAnthropicTools = json::array(
    {{{"name", "get_weather"},
      {"description", "Weather for a city"},
      {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}});

const json kChatTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "Weather for a city"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});

// The Chat Completions conversation both round-trip tests translate to: a system prompt, a
// question, an assistant turn that thought, answered and called get_weather (`call_id`), the
// result and a follow-up.
json weather_conversation(const std::string& call_id) {
  const json call = {
      {"id", call_id},
      {"type", "function"},
      {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}};
  return json::array({{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Weather in Paris?"}},
                      {{"role", "assistant"},
                       {"content", "Checking."},
                       {"reasoning_content", "Look it up."},
                       {"tool_calls", json::array({call})}},
                      {{"role", "tool"}, {"tool_call_id", call_id}, {"content", "sunny"}},
                      {{"role", "user"}, {"content", "And tomorrow?"}}});
}

TEST(ServerApi, AnthropicToolRoundTripRendersAsChatCompletions) {
  const json anthropic = {
      {"model", "kimi-k3"},
      {"max_tokens", 100},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief."}}})},
      {"tools", kAnthropicTools},
      {"thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"},
             {"content",
              json::array({{{"type", "thinking"}, {"thinking", "Look it up."}, {"signature", ""}},
                           {{"type", "text"}, {"text", "Checking."}},
                           {{"type", "tool_use"},
                            {"id", "toolu_1"},
                            {"name", "get_weather"},
                            {"input", {{"city", "Paris"}}}}})}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "tool_result"},
                            {"tool_use_id", "toolu_1"},
                            {"content", json::array({{{"type", "text"}, {"text", "sunny"}}})}},
                           {{"type", "text"}, {"text", "And tomorrow?"}}})}}})}};
  const json chat = {{"model", "kimi-k3"},  {"max_tokens", 100},
                     {"thinking", true},    {"reasoning_effort", "low"},  // budget_tokens < 4096
                     {"tools", kChatTools}, {"messages", weather_conversation("toolu_1")}};
  const Translation t = anthropic_messages(anthropic, limits(), k3());
  const ServeRequest expected = parse_chat_request(chat, limits(), k3());
  EXPECT_EQ(t.request.prompt, expected.prompt) << k3().decode(t.request.prompt);
  const std::string text = k3().decode(t.request.prompt);
  EXPECT_NE(text.find("Look it up."), std::string::npos);  // past thinking in the think channel
  EXPECT_NE(text.find("tool=\"get_weather\" index=\"1\"<|sep|>sunny"), std::string::npos) << text;
  EXPECT_EQ(anthropic_count_tokens(anthropic, limits(), k3())["input_tokens"],
            static_cast<int64_t>(expected.prompt.size()));
}

TEST(ServerApi, AnthropicStreamAndMessage) {
  json body = {{"model", "kimi-k3"},
               {"max_tokens", 200},
               {"tools", kAnthropicTools},
               {"thinking", {{"type", "adaptive"}}},
               {"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})}};
  Driven d = drive(anthropic_messages(body, limits(), k3()), kThinkTextTool);
  const auto frames = sse_frames(d.stream);
  // message_start, then blocks 0 (thinking), 1 (text), 2 and 3 (tool_use), each started,
  // delta'd and stopped in order, then message_delta and message_stop.
  std::vector<std::string> names;
  for (const auto& [n, j] : frames) names.push_back(n);
  ASSERT_GE(names.size(), 12u);
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  int open = -1, next = 0;
  std::string thinking, text, args[2];
  for (const auto& [n, j] : frames) {
    if (n == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(j["index"], next);
      open = next++;
    } else if (n == "content_block_delta") {
      EXPECT_EQ(j["index"], open);
      const json& dl = j["delta"];
      if (dl["type"] == "thinking_delta") thinking += dl["thinking"].get<std::string>();
      if (dl["type"] == "text_delta") text += dl["text"].get<std::string>();
      if (dl["type"] == "input_json_delta") args[open - 2] += dl["partial_json"].get<std::string>();
    } else if (n == "content_block_stop") {
      EXPECT_EQ(j["index"], open);
      open = -1;
    }
  }
  EXPECT_EQ(next, 4);
  EXPECT_EQ(thinking, "Paris, then.");
  EXPECT_EQ(text, "Checking.");
  EXPECT_EQ(json::parse(args[0]), json({{"city", "Paris"}}));
  EXPECT_EQ(json::parse(args[1]), json({{"city", "Rome"}}));
  const json& md = frames[frames.size() - 2].second;
  EXPECT_EQ(md["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(md["usage"]["cache_read_input_tokens"], 3);
  EXPECT_EQ(md["usage"]["input_tokens"], d.outcome.usage.prompt_tokens - 3);
  // The whole message: the same blocks.
  const json& c = d.response["content"];
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0], json({{"type", "thinking"}, {"thinking", "Paris, then."}, {"signature", ""}}));
  EXPECT_EQ(c[1], json({{"type", "text"}, {"text", "Checking."}}));
  EXPECT_EQ(c[2]["type"], "tool_use");
  EXPECT_EQ(c[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(c[2]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(c[3]["input"], json({{"city", "Rome"}}));
  EXPECT_EQ(d.response["stop_reason"], "tool_use");
  EXPECT_EQ(d.response["type"], "message");
  // The state is kept as the Chat Completions answer would be.
  ASSERT_EQ(d.response["content"].size(), 4u);

  // One tool call only: the second is not reported.
  body["tool_choice"] = {{"type", "auto"}, {"disable_parallel_tool_use", true}};
  Driven one = drive(anthropic_messages(body, limits(), k3()), kThinkTextTool);
  EXPECT_EQ(one.response["content"].size(), 3u);
  // display: omitted keeps the blocks, not their text.
  body["thinking"] = {{"type", "adaptive"}, {"display", "omitted"}};
  Driven omitted = drive(anthropic_messages(body, limits(), k3()), kThinkTextTool);
  EXPECT_EQ(omitted.response["content"][0]["thinking"], "");
  EXPECT_EQ(omitted.stream.find("thinking_delta"), std::string::npos);
}

TEST(ServerApi, AnthropicStopSequenceAndMaxTokens) {
  json body = {{"model", "kimi-k3"},
               {"max_tokens", 50},
               {"stop_sequences", json::array({"STOP", "never"})},
               {"messages", json::array({{{"role", "user"}, {"content", "Go"}}})}};
  Driven d = drive(anthropic_messages(body, limits(), k3()), "Some text STOP more text");
  EXPECT_EQ(d.response["stop_reason"], "stop_sequence");
  EXPECT_EQ(d.response["stop_sequence"], "STOP");
  EXPECT_EQ(d.response["content"][0]["text"], "Some text ");
  body["max_tokens"] = 2;
  body.erase("stop_sequences");
  Driven m = drive(anthropic_messages(body, limits(), k3()), "Some text STOP more text");
  EXPECT_EQ(m.response["stop_reason"], "max_tokens");
  EXPECT_TRUE(m.response["stop_sequence"].is_null());
}

void expect_refused(const std::function<void()>& f, const std::string& param,
                    const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "not refused: " << param;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_EQ(e.param().value_or(""), param) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(ServerApi, AnthropicRefusals) {
  const json base = {{"model", "kimi-k3"},
                     {"max_tokens", 10},
                     {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  auto with = [&](const char* k, json v) {
    json b = base;
    b[k] = std::move(v);
    return [b] { anthropic_messages(b, limits(), k3()); };
  };
  json no_max = base;
  no_max.erase("max_tokens");
  expect_refused([&] { anthropic_messages(no_max, limits(), k3()); }, "max_tokens", "required");
  expect_refused(with("mcp_servers", json::array()), "mcp_servers", "not supported");
  expect_refused(with("temperature", 1.5), "temperature", "0 to 1");
  expect_refused(with("thinking", {{"type", "enabled"}, {"budget_tokens", 10}}),
                 "thinking.budget_tokens", "1024");
  expect_refused(
      with("messages",
           json::array({{{"role", "user"}, {"content", json::array({{{"type", "image"}}})}}})),
      "messages[0].content[0].source", "required");
  expect_refused(
      with("messages",
           json::array(
               {{{"role", "user"},
                 {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "x"}}})}}})),
      "messages[0].content[0].tool_use_id", "no tool_use block");
  expect_refused(with("messages", json::array({{{"role", "user"}, {"content", "x"}},
                                               {{"role", "assistant"}, {"content", "y"}}})),
                 "messages", "prefill");
  expect_refused(with("tools", json::array({{{"type", "web_search_20250305"}, {"name", "w"}}})),
                 "tools[0].type", "custom tools");
  expect_refused(with("context_management",
                      {{"edits", json::array({{{"type", "clear_tool_uses_20250919"}}})}}),
                 "context_management.edits[0]", "clear_thinking");
  // What Claude Code sends is accepted: adaptive thinking, effort, context management that
  // clears thinking, a deferred tool (left out), mid-conversation system text, cache_control.
  json cc = base;
  cc["thinking"] = {{"type", "adaptive"}, {"display", "omitted"}};
  cc["output_config"] = {{"effort", "high"}};
  cc["context_management"] = {
      {"edits", json::array({{{"type", "clear_thinking_20251015"}, {"keep", "all"}}})}};
  cc["metadata"] = {{"user_id", "u"}};
  cc["tools"] = kAnthropicTools;
  cc["tools"].push_back(
      {{"name", "Later"}, {"input_schema", {{"type", "object"}}}, {"defer_loading", true}});
  cc["messages"].push_back(
      {{"role", "system"},
       {"content",
        json::array(
            {{{"type", "text"}, {"text", "ctx"}, {"cache_control", {{"type", "ephemeral"}}}}})}});
  const Translation t = anthropic_messages(cc, limits(), k3());
  const std::string text = k3().decode(t.request.prompt);
  EXPECT_NE(text.find("thinking_effort=high"), std::string::npos);
  EXPECT_EQ(text.find("Later"), std::string::npos);
  EXPECT_NE(text.find("get_weather"), std::string::npos);
}

TEST(ServerApi, ResponsesInputRendersAsChatCompletions) {
  const json responses = {
      {"model", "kimi-k3"},
      {"instructions", "Be brief."},
      {"reasoning", {{"effort", "medium"}, {"summary", "auto"}}},
      {"tools",
       json::array(
           {{{"type", "function"},
             {"name", "get_weather"},
             {"description", "Weather for a city"},
             {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}},
             {"strict", false}},
            {{"type", "web_search"}}})},
      {"input",
       json::array(
           {{{"type", "message"},
             {"role", "user"},
             {"content", json::array({{{"type", "input_text"}, {"text", "Weather in Paris?"}}})}},
            {{"type", "reasoning"},
             {"id", "rs_1"},
             {"summary", json::array()},
             {"content", json::array({{{"type", "reasoning_text"}, {"text", "Look it up."}}})}},
            {{"type", "message"},
             {"role", "assistant"},
             {"content", json::array({{{"type", "output_text"}, {"text", "Checking."}}})}},
            {{"type", "function_call"},
             {"call_id", "call_1"},
             {"name", "get_weather"},
             {"arguments", "{\"city\":\"Paris\"}"}},
            {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}},
            {{"role", "user"}, {"content", "And tomorrow?"}}})}};
  json chat = {{"model", "kimi-k3"},
               {"reasoning_effort", "high"},
               {"tools", kChatTools},
               {"messages", weather_conversation("call_1")}};
  const Translation t = responses_create(responses, limits(), k3());
  EXPECT_EQ(t.request.prompt, parse_chat_request(chat, limits(), k3()).prompt)
      << k3().decode(t.request.prompt);
  EXPECT_TRUE(t.request.params.start_channel == Channel::think);
  json off = responses;
  off["reasoning"] = {{"effort", "none"}};
  EXPECT_TRUE(responses_create(off, limits(), k3()).request.params.start_channel ==
              Channel::response);
  json prev = responses;
  prev["previous_response_id"] = "resp_1";
  expect_refused([&] { responses_create(prev, limits(), k3()); }, "previous_response_id",
                 "not stored");
}

TEST(ServerApi, ResponsesEventsAndItems) {
  const json body = {{"model", "kimi-k3"},
                     {"max_output_tokens", 300},
                     {"tools", json::array({{{"type", "function"},
                                             {"name", "get_weather"},
                                             {"parameters", {{"type", "object"}}}}})},
                     {"input", "Weather?"}};
  Driven d = drive(responses_create(body, limits(), k3()), kThinkTextTool);
  const auto frames = sse_frames(d.stream);
  ASSERT_GE(frames.size(), 10u);
  EXPECT_EQ(frames[0].first, "response.created");
  EXPECT_EQ(frames[1].first, "response.in_progress");
  EXPECT_EQ(frames.back().first, "response.completed");
  int64_t seq = 0;
  std::string reasoning, text, args[2];
  std::vector<std::string> added;
  for (const auto& [n, j] : frames) {
    EXPECT_EQ(j["sequence_number"], seq++);
    if (n == "response.output_item.added") added.push_back(j["item"]["type"]);
    if (n == "response.reasoning_text.delta") reasoning += j["delta"].get<std::string>();
    if (n == "response.output_text.delta") text += j["delta"].get<std::string>();
    if (n == "response.function_call_arguments.delta")
      args[j["output_index"].get<int>() - 2] += j["delta"].get<std::string>();
  }
  EXPECT_EQ(added,
            (std::vector<std::string>{"reasoning", "message", "function_call", "function_call"}));
  EXPECT_EQ(reasoning, "Paris, then.");
  EXPECT_EQ(text, "Checking.");
  EXPECT_EQ(args[0], "{\"city\":\"Paris\"}");
  const json& out = d.response["output"];
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0]["content"][0]["text"], "Paris, then.");
  EXPECT_EQ(out[1]["content"][0]["text"], "Checking.");
  EXPECT_EQ(out[2]["name"], "get_weather");
  EXPECT_EQ(out[2]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(out[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(d.response["status"], "completed");
  EXPECT_EQ(d.response["usage"]["input_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(frames.back().second["response"]["output"], out);
  // Cut by max_output_tokens: incomplete.
  json short_body = body;
  short_body["max_output_tokens"] = 3;
  Driven cut = drive(responses_create(short_body, limits(), k3()), kThinkTextTool);
  EXPECT_EQ(cut.response["status"], "incomplete");
  EXPECT_EQ(cut.response["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(sse_frames(cut.stream).back().first, "response.incomplete");
}

TEST(ServerApi, OllamaChatAndGenerate) {
  ServeLimits l = limits();
  const json body = {{"model", "kimi-k3:latest"},
                     {"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})},
                     {"tools", kChatTools},
                     {"think", true},
                     {"options", {{"temperature", 0}, {"num_predict", 300}, {"num_ctx", 8192}}}};
  Translation t = ollama_generate(true, body, l, k3());
  EXPECT_TRUE(t.request.stream);  // Ollama streams unless told not to
  EXPECT_EQ(t.request.params.max_new_tokens, 300);
  Driven d = drive(std::move(t), kThinkTextTool);
  std::string content, thinking;
  int calls = 0;
  json last;
  size_t at = 0;
  while (at < d.stream.size()) {
    const size_t nl = d.stream.find('\n', at);
    ASSERT_NE(nl, std::string::npos);
    last = json::parse(d.stream.substr(at, nl - at));
    at = nl + 1;
    content += last["message"]["content"].get<std::string>();
    thinking += last["message"].value("thinking", "");
    calls += static_cast<int>(last["message"].value("tool_calls", json::array()).size());
  }
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(thinking, "Paris, then.");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "stop");
  const json& m = d.response["message"];
  EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], json({{"city", "Rome"}}));
  EXPECT_EQ(d.response["eval_count"], d.outcome.usage.completion_tokens);

  const json gen = {{"model", "kimi-k3"}, {"prompt", "Hello"}, {"stream", false}, {"think", false}};
  Driven g = drive(ollama_generate(false, gen, l, k3()), "Hi there<|end_of_msg|>");
  EXPECT_EQ(g.response["response"], "Hi there");
  const json raw = {{"model", "kimi-k3"}, {"prompt", "Hello"}, {"raw", true}};
  EXPECT_FALSE(ollama_generate(false, raw, l, k3()).request.params.chat);
  EXPECT_EQ(ollama_load_only(false, {{"model", "kimi-k3"}}, l).value()["done_reason"], "load");
  expect_refused(
      [&] {
        ollama_generate(true,
                        json{{"model", "kimi-k3"},
                             {"messages", body["messages"]},
                             {"options", {{"mirostat", 2}}}},
                        l, k3());
      },
      "options.mirostat", "not supported");
  try {
    ollama_info("/api/embed", R"({"model":"kimi-k3","input":"x"})", l, 0);
    ADD_FAILURE() << "embed answered";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("does not support embeddings"), std::string::npos);
    EXPECT_EQ(error_json(e, ErrorStyle::ollama), json({{"error", e.what()}}));
  }
  EXPECT_EQ(ollama_info("/api/tags", "", l, 0)["models"][0]["name"], "kimi-k3");
  EXPECT_EQ(ollama_info("/api/show", R"({"model":"kimi-k3"})", l,
                        0)["model_info"]["kimi_k3.context_length"],
            8192);
}

TEST(ServerApi, TokenizeAndDetokenize) {
  const json t = tokenize({{"content", "Hello <|end_of_msg|>"}, {"with_pieces", true}}, k3());
  std::vector<int32_t> ids;
  std::string joined;
  for (const auto& p : t["tokens"]) {
    ids.push_back(p["id"]);
    joined += p["piece"].get<std::string>();
  }
  EXPECT_EQ(ids, k3().encode_with_special("Hello <|end_of_msg|>"));
  EXPECT_EQ(joined, "Hello <|end_of_msg|>");
  EXPECT_EQ(tokenize({{"content", "<|end_of_msg|>"}, {"parse_special", false}}, k3())["tokens"],
            json(k3().encode_ordinary("<|end_of_msg|>")));
  EXPECT_EQ(detokenize({{"tokens", json(ids)}}, k3())["content"], "Hello <|end_of_msg|>");
  expect_refused(
      [&] {
        detokenize({{"tokens", json::array({-1})}}, k3());
      },
      "tokens", "not a token id");
}

TEST(ServerApi, ErrorStyles) {
  const ApiError e(404, "no such model", "invalid_request_error", "model", "model_not_found");
  EXPECT_EQ(error_json(e, ErrorStyle::anthropic),
            json({{"type", "error"},
                  {"error", {{"type", "not_found_error"}, {"message", "no such model"}}}}));
  EXPECT_EQ(error_json(e, ErrorStyle::openai), e.to_json());
  EXPECT_EQ(error_json(ApiError(401, "k", "x"), ErrorStyle::anthropic)["error"]["type"],
            "authentication_error");
}

// The official SDKs' stream parsers accept the wires' tool-call streams (tool_use blocks with
// input_json_delta, function_call items with argument deltas): the streams driven above are
// served to them by tests/api_clients/replay_test.mjs.
TEST(ServerClients, SdkParsersAcceptToolCallStreams) {
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "node/npm not installed";
  const json body = {{"model", "kimi-k3"},
                     {"max_tokens", 300},
                     {"thinking", {{"type", "adaptive"}}},
                     {"tools", kAnthropicTools},
                     {"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})}};
  const json rbody = {{"model", "kimi-k3"},
                      {"tools", json::array({{{"type", "function"},
                                              {"name", "get_weather"},
                                              {"parameters", {{"type", "object"}}}}})},
                      {"input", "Weather?"}};
  const std::string dir = test::temp_dir("sdk-replay");
  test::spit(dir + "/anthropic.sse",
             drive(anthropic_messages(body, limits(), k3()), kThinkTextTool).stream);
  test::spit(dir + "/responses.sse",
             drive(responses_create(rbody, limits(), k3()), kThinkTextTool).stream);
  std::string out;
  int code = -1;
  ASSERT_TRUE(test::run_node_test("api_clients", "@anthropic-ai/sdk",
                                  "DELTAFIN_ANTHROPIC_STREAM=" + dir +
                                      "/anthropic.sse DELTAFIN_RESPONSES_STREAM=" + dir +
                                      "/responses.sse",
                                  "replay_test.mjs", out, code))
      << out;
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace deltafin::server
