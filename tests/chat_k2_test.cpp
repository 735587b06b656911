// The K2-family chat formats: every golden of tests/data/chat/k2-instruct and k2-thinking
// (rendered by the released Jinja templates) through the library and through `deltafin render`
// (which, like the server, refuses an empty message list),
// with the two documented departures (k2-instruct's null content renders as empty; a null
// reasoning_content is absent, not "None"); the ids (only the structure is special, content
// stays ordinary text); the prompt marks state reuse relies on; the rules the goldens do not
// cover (K2.5's generation prompt, Kimi-Linear, ids made for calls without one, refusals); and
// the rule that picks the format from a model folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixtures/synthetic_tokenizer.h"
#include "k2_tokenizer.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_check.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

using json = nlohmann::ordered_json;
using test::data_dir;
using test::run_deltafin;
using test::slurp;
using test::spit;
using test::temp_dir;

const Tokenizer& k2_base() {
  static const Tokenizer t = Tokenizer::load(test::k2_tokenizer_dir());
  return t;
}

Tokenizer k2(ChatFormat f) {
  return k2_base().with_chat_format(f);
}

json golden_file(const std::string& family) {
  return json::parse(slurp(data_dir() + "/chat/" + family + "/cases.json"));
}

json request_of(const json& c) {
  json req = json::object();
  for (const auto& [k, v] : c.items()) {
    if (k != "name" && k != "expected" && k != "expected_error") req[k] = v;
  }
  return req;
}

const std::vector<std::string> kStructure = {"<|im_system|>",
                                             "<|im_user|>",
                                             "<|im_assistant|>",
                                             "<|im_middle|>",
                                             "<|im_end|>",
                                             "<think>",
                                             "</think>",
                                             "<|tool_calls_section_begin|>",
                                             "<|tool_calls_section_end|>",
                                             "<|tool_call_begin|>",
                                             "<|tool_call_argument_begin|>",
                                             "<|tool_call_end|>"};

std::size_t count_markers(std::string_view s) {
  std::size_t n = 0;
  for (const auto& m : kStructure) {
    for (std::size_t p = s.find(m); p != std::string_view::npos; p = s.find(m, p + 1)) ++n;
  }
  return n;
}

std::size_t count_markers_in(const json& v) {
  std::size_t n = 0;
  if (v.is_string()) return count_markers(v.get<std::string>());
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) n += count_markers(k) + count_markers_in(x);
  }
  if (v.is_array()) {
    for (const auto& x : v) n += count_markers_in(x);
  }
  return n;
}

// The ids decode to the text, every run between two special ids is the ordinary encoding of its
// bytes, the special ids are the format's structure, and there are exactly as many as the text
// has markers outside the request's strings.
void check_ids(const std::string& text, const std::vector<int32_t>& ids, const json& request) {
  const Tokenizer& t = k2_base();
  EXPECT_EQ(t.decode(ids), text);
  std::vector<int32_t> structure;
  for (const auto& m : kStructure) structure.push_back(*t.special_id(m));
  std::size_t specials = 0;
  std::vector<int32_t> run;
  const auto check_run = [&] {
    EXPECT_EQ(t.encode_ordinary(t.decode(run)), run) << t.decode(run);
    run.clear();
  };
  for (const int32_t id : ids) {
    if (t.is_special(id)) {
      EXPECT_NE(std::find(structure.begin(), structure.end(), id), structure.end()) << id;
      ++specials;
      check_run();
    } else {
      run.push_back(id);
    }
  }
  check_run();
  EXPECT_EQ(specials, count_markers(text) - count_markers_in(request)) << text;
}

struct Golden {
  std::string family;
  ChatFormat format;
};
const Golden kGoldens[] = {{"k2-instruct", ChatFormat::k2_instruct},
                           {"k2-thinking", ChatFormat::k2_thinking}};

// What the engine renders for a golden case: the template's text, except where docs/FAMILY.md
// records a decision (returned with the reason).
std::string engine_expected(const Golden& g, const json& file, const json& c) {
  const std::string name = c["name"].get<std::string>();
  if (c.contains("expected_error")) {
    // k2-instruct raises on an assistant message whose content is null (OpenAI's shape of a
    // tool-call turn); the engine renders it as empty content: the same text as the golden of
    // the same conversation with content "".
    EXPECT_EQ(g.family, "k2-instruct") << name;
    EXPECT_EQ(name, "assistant tool call with null content");
    for (const auto& other : file["cases"]) {
      if (other["name"] == "one tool call (string arguments) and its result")
        return other["expected"].get<std::string>();
    }
    ADD_FAILURE() << "the golden with empty content is missing";
    return "";
  }
  std::string expected = c["expected"].get<std::string>();
  if (name == "reasoning_content null in an open tool turn" && g.family == "k2-thinking") {
    // The template writes Python's None for a null reasoning_content; the engine treats null as
    // absent.
    const std::string none = "<think>None</think>";
    const auto at = expected.find(none);
    EXPECT_NE(at, std::string::npos);
    EXPECT_EQ(expected.find(none, at + 1), std::string::npos);
    expected.replace(at, none.size(), "<think></think>");
  }
  return expected;
}

TEST(ChatK2Golden, LibraryReproducesEveryCase) {
  for (const Golden& g : kGoldens) {
    const json file = golden_file(g.family);
    ASSERT_EQ(file["cases"].size(), 22u) << g.family;
    const Tokenizer tok = k2(g.format);
    int departures = 0;
    for (const auto& c : file["cases"]) {
      const json req = request_of(c);
      const std::string expected = engine_expected(g, file, c);
      departures += c.contains("expected_error") || expected != c.value("expected", "");
      const RenderedPrompt p = render_json(req, tok);
      EXPECT_EQ(p.text, expected) << g.family << ": " << c["name"];
      EXPECT_EQ(render_text(ChatRequest::from_json(req), g.format), p.text);
      check_ids(p.text, p.ids, req);
    }
    EXPECT_EQ(departures, 1) << g.family;  // exactly the documented one per family
  }
}

TEST(ChatK2Golden, BinaryReproducesEveryCase) {
  const std::string dir = temp_dir("chat-k2-golden");
  for (const Golden& g : kGoldens) {
    const json file = golden_file(g.family);
    const Tokenizer tok = k2(g.format);
    int n = 0;
    for (const auto& c : file["cases"]) {
      const json req = request_of(c);
      const std::string path = dir + "/" + g.family + std::to_string(n++) + ".json";
      spit(path, req.dump());
      const std::vector<std::string> args = {"render",
                                             "--model",
                                             test::k2_tokenizer_dir(),
                                             "--chat-format",
                                             chat_format_name(g.format),
                                             "--request",
                                             path};
      const auto r = run_deltafin(args);
      if (req["messages"].empty()) {
        // The library renders it (above); the command refuses what the server refuses.
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_EQ(r.err, "deltafin: messages: must not be empty\n");
        continue;
      }
      ASSERT_EQ(r.exit_code, 0) << c["name"] << ": " << r.err;
      EXPECT_EQ(r.out, engine_expected(g, file, c)) << c["name"];
      auto with_json = args;
      with_json.push_back("--json");
      const auto j = run_deltafin(with_json);
      ASSERT_EQ(j.exit_code, 0) << j.err;
      const json out = json::parse(j.out);
      EXPECT_EQ(out["text"].get<std::string>(), r.out);
      EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), render_json(req, tok).ids);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Marks.

json msg(const char* role, const char* content) {
  return {{"role", role}, {"content", content}};
}

int64_t ids_of(const json& messages, ChatFormat f, bool gen = false, const json& tools = nullptr) {
  json req = {{"messages", messages}, {"add_generation_prompt", gen}};
  if (!tools.is_null()) req["tools"] = tools;
  return static_cast<int64_t>(render_json(req, k2(f)).ids.size());
}

TEST(ChatK2Render, MarksSitWhereK3sDo) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  for (const ChatFormat f : {ChatFormat::k2_instruct, ChatFormat::k2_thinking, ChatFormat::k2_5,
                             ChatFormat::kimi_linear}) {
    SCOPED_TRACE(chat_format_name(f));
    const json conv = {msg("system", "Be brief."),
                       msg("system", "Really."),
                       msg("user", "2+2?"),
                       {{"role", "assistant"}, {"content", "4"}, {"reasoning_content", "Sum."}},
                       msg("user", "And 3+3?")};
    const RenderedPrompt p =
        render_json({{"messages", conv}, {"tools", tools}, {"add_generation_prompt", true}}, k2(f));
    // After the tool declaration and both leading system messages; before and after the last
    // message; the generation prompt follows.
    EXPECT_EQ(p.system_end, ids_of(json::array({conv[0], conv[1]}), f, false, tools));
    EXPECT_EQ(p.last_message,
              ids_of(json::array({conv[0], conv[1], conv[2], conv[3]}), f, false, tools));
    EXPECT_EQ(p.messages_end, ids_of(conv, f, false, tools));
    EXPECT_GT(static_cast<int64_t>(p.ids.size()), p.messages_end);
    // The earlier prompt is a prefix of the later one, up to its messages' end.
    const auto before = render_json(
        {{"messages", json::array({conv[0], conv[1], conv[2]})}, {"tools", tools}}, k2(f));
    ASSERT_LE(before.messages_end, static_cast<int64_t>(p.ids.size()));
    EXPECT_TRUE(
        std::equal(before.ids.begin(), before.ids.begin() + before.messages_end, p.ids.begin()));
  }
  // A default system prompt is part of the system block.
  const RenderedPrompt d =
      render_json({{"messages", {msg("user", "Hi")}}}, k2(ChatFormat::k2_thinking));
  const std::string head =
      "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
      "AI.<|im_end|>";
  EXPECT_EQ(d.system_end, static_cast<int64_t>(k2_base().encode_with_special(head).size()));
  EXPECT_EQ(d.last_message, d.system_end);
  // Without a tokenizer there are no ids to mark.
  const ChatRequest req = ChatRequest::from_json({{"messages", {msg("user", "Hi")}}});
  EXPECT_EQ(render_k2(req, nullptr, ChatFormat::k2_thinking).messages_end, 0);
}

// ---------------------------------------------------------------------------------------------
// Rules beyond the goldens.

const std::string kGen = "<|im_assistant|>assistant<|im_middle|>";

TEST(ChatK2Render, ThinkingSwitchPerFormat) {
  const json hi = json::array({msg("user", "Hi")});  // not {msg(...)}: clang reads that as a copy
  const auto text = [&](ChatFormat f, bool thinking) {
    return render_json({{"messages", hi}, {"thinking", thinking}}, k2(f)).text;
  };
  const std::string kimi =
      "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
      "AI.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>";
  EXPECT_EQ(text(ChatFormat::k2_thinking, true), kimi + kGen);  // the model opens <think>
  EXPECT_EQ(text(ChatFormat::k2_thinking, false), kimi + kGen + "<think></think>");
  EXPECT_EQ(text(ChatFormat::k2_5, true), kimi + kGen + "<think>");
  EXPECT_EQ(text(ChatFormat::k2_5, false), kimi + kGen + "<think></think>");
  const std::string instruct =
      "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user<|im_"
      "middle|>Hi<|im_end|>";
  EXPECT_EQ(text(ChatFormat::k2_instruct, true), instruct + kGen);
  EXPECT_EQ(text(ChatFormat::k2_instruct, false), instruct + kGen);
  // Kimi-Linear: no default system prompt, no think markers (the reported bare user turn).
  EXPECT_EQ(text(ChatFormat::kimi_linear, true), "<|im_user|>user<|im_middle|>Hi<|im_end|>" + kGen);
  // Effort, tool_choice and response_format are not part of any K2 prompt.
  EXPECT_EQ(render_json({{"messages", hi},
                         {"reasoning_effort", "low"},
                         {"tool_choice", "none"},
                         {"response_format", {{"type", "json_object"}}}},
                        k2(ChatFormat::k2_thinking))
                .text,
            kimi + kGen);
}

TEST(ChatK2Render, KimiLinearToolLoop) {
  const json req = json::parse(R"({"messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "dropped",
     "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather",
     "content": "rain"}], "add_generation_prompt": true})");
  EXPECT_EQ(render_json(req, k2(ChatFormat::kimi_linear)).text,
            "<|im_user|>user<|im_middle|>Weather?<|im_end|><|im_assistant|>assistant<|im_middle|>"
            "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_"
            "call_argument_begin|>{\"city\":\"Oslo\"}<|tool_call_end|><|tool_calls_section_end|><|"
            "im_end|><|im_system|>get_weather<|im_middle|>## Return of "
            "functions.get_weather:0\nrain<|im_end|>" +
                kGen);
}

TEST(ChatK2Render, CallsWithoutIdsGetOneAndArgumentsKeepTheirText) {
  const json req = json::parse(R"({"messages": [
    {"role": "user", "content": "Go"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "a", "arguments": {"x": 1, "é": "ü"}}},
      {"id": "functions.b:7", "type": "function", "function": {"name": "b", "arguments": null}}]},
    {"role": "tool", "content": "r1"},
    {"role": "tool", "tool_call_id": null, "content": "r2"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "c", "arguments": "{ \"y\" :2 }"}}]}],
    "add_generation_prompt": false})");
  const std::string text = render_json(req, k2(ChatFormat::k2_thinking)).text;
  // Ids count the conversation's calls from 0; an object is tojson'd, a string kept verbatim,
  // null arguments are {}; a tool result without an id says so with nothing, not "None".
  EXPECT_NE(text.find("<|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": 1, "
                      "\"é\": \"ü\"}<|tool_call_end|>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<|tool_call_begin|>functions.b:7<|tool_call_argument_begin|>{}"),
            std::string::npos);
  EXPECT_NE(text.find("<|tool_call_begin|>functions.c:2<|tool_call_argument_begin|>{ \"y\" :2 }"),
            std::string::npos);
  EXPECT_NE(text.find("<|im_system|>tool<|im_middle|>## Return of \nr1<|im_end|>"),
            std::string::npos);
  EXPECT_NE(text.find("## Return of \nr2"), std::string::npos);
  // The last turn has calls, so both turns are still open: both think blocks stay (empty here).
  EXPECT_EQ(text.find("None"), std::string::npos);
}

TEST(ChatK2Render, RefusalsAndMissingTokens) {
  const json dyn = {{"messages",
                     {{{"role", "system"},
                       {"tools", json::parse(R"([{"type":"function","function":{"name":"f"}}])")}},
                      msg("user", "Hi")}}};
  for (const ChatFormat f : {ChatFormat::k2_instruct, ChatFormat::k2_thinking}) {
    try {
      render_json(dyn, k2(f));
      ADD_FAILURE() << "rendered";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("messages[0].tools: the "), std::string::npos)
          << e.what();
    }
    try {
      check_chat_body(dyn, f);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("messages[0].tools: not supported by the ", 0), 0u)
          << e.what();
    }
  }
  EXPECT_NO_THROW(check_chat_body(dyn, ChatFormat::k3));  // K3's dynamic declaration
  EXPECT_NO_THROW(check_chat_body(dyn));
  const json image = {
      {"messages",
       {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}};
  try {
    check_chat_body(image, ChatFormat::k2_thinking);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(the k2-thinking text model)"), std::string::npos)
        << e.what();
  }
  // A tokenizer without <think> can render K2-Instruct but not K2.5's generation prompt.
  std::map<int32_t, std::string> names = {{2, "<|im_end|>"},
                                          {3, "<|im_user|>"},
                                          {4, "<|im_assistant|>"},
                                          {10, "<|im_system|>"},
                                          {17, "<|im_middle|>"}};
  std::vector<std::string> ranks;
  for (int b = 0; b < 256; ++b) ranks.emplace_back(1, static_cast<char>(b));
  const Tokenizer plain = Tokenizer::from_ranks(ranks, names);
  EXPECT_EQ(plain.chat_format(), ChatFormat::k2_instruct);
  EXPECT_NO_THROW(render_json({{"messages", {msg("user", "Hi")}}}, plain));
  try {
    render_json({{"messages", {msg("user", "Hi")}}}, plain.with_chat_format(ChatFormat::k2_5));
    ADD_FAILURE() << "rendered";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tokenizer has no special token <think>, which the k2.5 chat format needs");
  }
}

// ---------------------------------------------------------------------------------------------
// The format rule.

std::string k2_folder(const std::string& name) {
  const std::string dir = temp_dir(name);
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"})
    std::filesystem::copy_file(test::k2_tokenizer_dir() + "/" + f, dir + "/" + f);
  return dir;
}

TEST(ChatFormatRule, ChosenFromTheModelFolder) {
  EXPECT_EQ(Tokenizer::load(data_dir() + "/tokenizer").chat_format(), ChatFormat::k3);
  EXPECT_EQ(k2_base().chat_format(), ChatFormat::k2_thinking);  // K2 names with <think>
  const std::string older = temp_dir("fmt-k2");  // K2-Instruct's and Kimi-Linear's names
  write_synthetic_tokenizer(older, 1024, SpecialNames::kK2);
  EXPECT_EQ(Tokenizer::load(older).chat_format(), ChatFormat::k2_instruct);
  spit(older + "/config.json", R"({"architectures": ["KimiLinearForCausalLM"]})");
  EXPECT_EQ(Tokenizer::load(older).chat_format(), ChatFormat::kimi_linear);

  // The chat template decides between K2-Instruct and K2-Thinking.
  std::string d = k2_folder("fmt-jinja");
  spit(d + "/chat_template.jinja", "{{ '<|im_user|>' }}{{ message['content'] }}");
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_instruct);
  spit(d + "/chat_template.jinja", "<think>{{ rc }}</think>");
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_thinking);
  // tokenizer_config.json's template wins over the file; the named-list form reads "default".
  json cfg = json::parse(slurp(d + "/tokenizer_config.json"));
  cfg["chat_template"] = "{{ '<|im_assistant|>' }}";
  spit(d + "/tokenizer_config.json", cfg.dump());
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_instruct);
  cfg["chat_template"] = json::parse(
      R"([{"name": "tool_use", "template": "<think>"}, {"name": "default", "template": "x"}])");
  spit(d + "/tokenizer_config.json", cfg.dump());
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_instruct);
  const auto error_of = [](const std::string& dir) {
    try {
      Tokenizer::load(dir);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  cfg["chat_template"] = 3;
  spit(d + "/tokenizer_config.json", cfg.dump());
  EXPECT_NE(error_of(d).find("tokenizer_config.json: chat_template: expected a string or a list"),
            std::string::npos)
      << error_of(d);

  // config.json routes Kimi-Linear and K2.5 whatever the template says.
  d = k2_folder("fmt-config");
  spit(d + "/config.json", R"({"architectures": ["KimiLinearForCausalLM"]})");
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::kimi_linear);
  spit(d + "/config.json",
       R"({"model_type": "kimi_k25", "text_config": {"model_type": "kimi_k2"}})");
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_5);
  spit(d + "/config.json",
       R"({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]})");
  EXPECT_EQ(Tokenizer::load(d).chat_format(), ChatFormat::k2_thinking);
  spit(d + "/config.json", "{not json");
  EXPECT_NE(error_of(d).find("config.json: not valid JSON"), std::string::npos) << error_of(d);
  // A K3 tokenizer stays K3 whatever config.json says.
  const std::string k3 = temp_dir("fmt-k3");
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"})
    std::filesystem::copy_file(data_dir() + "/tokenizer/" + f, k3 + "/" + f);
  spit(k3 + "/config.json", R"({"model_type": "kimi_linear"})");
  EXPECT_EQ(Tokenizer::load(k3).chat_format(), ChatFormat::k3);

  // Names round-trip; unknown ones are refused by render.
  for (const ChatFormat f : {ChatFormat::k3, ChatFormat::k2_instruct, ChatFormat::k2_thinking,
                             ChatFormat::k2_5, ChatFormat::kimi_linear})
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  EXPECT_FALSE(parse_chat_format("k2"));
  const std::string req = temp_dir("fmt-req") + "/r.json";
  spit(req, json({{"messages", {msg("user", "Hi")}}}).dump());
  auto r = run_deltafin({"render", "--model", d, "--chat-format", "k4", "--request", req});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--chat-format k4: unknown (expected auto, k3, k2-instruct, k2-thinking, "
                       "k2.5, kimi-linear)"),
            std::string::npos)
      << r.err;
  // Auto: the folder's rule (Kimi-Linear here, which has no default system prompt).
  spit(d + "/config.json", R"({"model_type": "kimi_linear"})");
  r = run_deltafin({"render", "--model", d, "--request", req});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_user|>user<|im_middle|>Hi<|im_end|>" + kGen);
}

TEST(ChatFormatRule, StopIdsAndTheSyntheticK2Tokenizer) {
  const Tokenizer& k3 = Tokenizer::load(data_dir() + "/tokenizer");
  EXPECT_EQ(chat_stop_ids(k3), std::vector<int32_t>{*k3.special_id("<|end_of_msg|>")});
  const Tokenizer& t = k2_base();
  const int32_t first = t.n_ranks();
  // K2's names at K3's ids: <|im_end|> is where K3's <|end_of_msg|> is.
  EXPECT_EQ(chat_stop_ids(t), (std::vector<int32_t>{first + 2, first + 1}));
  EXPECT_EQ(t.special_id("<|im_user|>"), first + 3);
  EXPECT_EQ(t.special_id("<|im_system|>"), first + 10);
  EXPECT_EQ(t.special_id("<|tool_call_begin|>"), first + 13);
  EXPECT_EQ(t.special_id("<|im_middle|>"), first + 17);
  EXPECT_EQ(t.special_id("</think>"), first + 23);
  EXPECT_FALSE(t.special_id("<|open|>"));
  // The tool tokens are declared non-special, as K2 does, and are still single added tokens.
  const json cfg = json::parse(slurp(test::k2_tokenizer_dir() + "/tokenizer_config.json"));
  const auto flag = [&](int32_t id) {
    return cfg["added_tokens_decoder"][std::to_string(id)]["special"].get<bool>();
  };
  for (int32_t off = 11; off <= 15; ++off) EXPECT_FALSE(flag(first + off)) << off;
  EXPECT_TRUE(flag(first + 2));
  EXPECT_EQ(t.encode_with_special("<|tool_call_begin|>x"),
            (std::vector<int32_t>{first + 13, *t.rank_of("x")}));
  const auto r = run_deltafin({"tokenize", "--model", test::k2_tokenizer_dir(), "--special",
                               "--text", "<|im_end|><|tool_call_end|>"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[" + std::to_string(first + 2) + "," + std::to_string(first + 15) + "]\n");
}

}  // namespace
}  // namespace deltafin
