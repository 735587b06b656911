// Structured output end to end, through the real server at temperature 1 (where unconstrained
// output is almost never valid), on the trained demo model (drafting with its EAGLE drafter, as
// it does by default) and on a tiny random-weight model (drafting with ngram):
//  * 41 JSON Schemas (tests/data/structured/schemas.json: nested objects, bounded arrays, enums
//    with non-ASCII strings, patterns, formats, recursive $ref, anyOf, allOf, ...) x 20 seeded
//    samples each (through `response_format` on the demo, llama-server's `json_schema` on the tiny
//    model), every answer validated by ajv (an independent
//    validator, tests/structured_output/validate.mjs);
//  * forced tool calls (`required` and a named function): the calls come back in the API's
//    shape and each call's arguments validate against its function's parameters;
//  * GBNF grammars through /v1/completions' `grammar`, each output checked by a PCRE2 pattern
//    written for it by hand (an independent recogniser);
//  * with thinking on, the thinking is free and the answer still validates.
// And on the CLI: greedy and seeded constrained output is identical with and without drafting
// (ngram and the demo's draft model, up to 4 drafts a pass, so most passes verify drafts the
// grammar allowed and cut where it refused).
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <thread>

#include "grammar/pda.h"
#include "server_util.h"
#include "test_util.h"
#include "tokenizer/chat.h"

namespace deltafin {
namespace {

using test::json;

// 20 samples per schema, tool set and grammar; 3 in the sanitizer builds (about ten times
// slower), whose stage checks memory and threads rather than the distribution of outputs.
constexpr int kSamples = grammar::kCompileSlowdown > 1 ? 3 : 20;

json data(const std::string& name) {
  return json::parse(test::slurp(test::data_dir() + "/structured/" + name));
}

// Posts every body from `threads` client threads; the replies in order.
std::vector<test::HttpResult> send_all(test::ServerProcess& srv, const std::string& path,
                                       const std::vector<json>& bodies, int threads = 8) {
  test::prime_client(srv);
  std::vector<test::HttpResult> out(bodies.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      auto c = srv.client(600);
      for (size_t i; (i = next.fetch_add(1)) < bodies.size();)
        out[i] = test::post_json(*c, path, bodies[i]);
    });
  }
  for (auto& th : pool) th.join();
  return out;
}

// ajv over a JSON Lines file of {id, schema, instance}; every line must validate.
void expect_valid(const std::vector<json>& lines, const std::string& label) {
  const std::string file = test::temp_dir("structured-" + label) + "/samples.jsonl";
  {
    std::ofstream f(file);
    for (const auto& l : lines) f << l.dump() << "\n";
  }
  std::string out;
  int code = -1;
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "node/npm not installed (the independent validator is ajv)";
  ASSERT_TRUE(
      test::run_node_test("structured_output", "ajv", "", "validate.mjs " + file, out, code))
      << out;
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(fmt::format("checked {}, failed 0", lines.size())), std::string::npos) << out;
}

int32_t special(const std::string& model, const char* name) {
  return Tokenizer::load(model).special_id(name).value();
}

// A logit bias toward what closes a string, an object, an array and an argument tag (`"`, `}`,
// `]`, <|close|>). At temperature 1 a random-weight model picks the next token nearly uniformly,
// so a free string, a long array or a recursive value would rarely end within max_tokens (and the
// demo model, trained on prose, likes to recurse); with the bias every sample finishes, which is
// what lets each one be validated. It changes the logits, never what the constraint allows:
// the output must still follow the schema token for token, and without the constraint it is
// still almost never valid.
json closing_bias(const std::string& model) {
  const Tokenizer tok = Tokenizer::load(model);
  json bias = json::object();
  for (const char* text : {"\"", "}", "]"}) {
    const auto ids = tok.encode_ordinary(text);
    if (ids.size() == 1) bias[std::to_string(ids[0])] = 5;
  }
  bias[std::to_string(tok.special_id(kCloseMarker).value())] = 5;
  return bias;
}

// `response_format` also describes the schema to the model in the prompt (a few hundred
// tokens per request); llama-server's `json_schema` field only enforces it.
void schemas_validate(const std::string& model, const std::vector<std::string>& args,
                      const std::string& label, bool response_format) {
  test::ServerProcess srv(args, model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  const json schemas = data("schemas.json");
  const json bias = closing_bias(model);
  std::vector<json> bodies;
  for (const auto& s : schemas) {
    for (int seed = 1; seed <= kSamples; ++seed) {
      json b = {{"messages", json::array({{{"role", "user"}, {"content", "Answer in JSON."}}})},
                {"temperature", 1.0},
                {"seed", seed},
                {"max_tokens", 800},
                {"logit_bias", bias},
                {"thinking", false}};
      if (response_format) {
        b["response_format"] = {
            {"type", "json_schema"},
            {"json_schema", {{"name", s["name"]}, {"strict", true}, {"schema", s["schema"]}}}};
      } else {
        b["json_schema"] = s["schema"];
      }
      bodies.push_back(b);
    }
  }
  // Thinking on for a few: free thinking, cut short by a bias on <|close|> so the test is quick.
  const int32_t close = special(model, kCloseMarker);
  for (int i = 0; i < 3; ++i) {
    json b = bodies[static_cast<size_t>(i * kSamples)];
    b["thinking"] = true;
    b["logit_bias"][std::to_string(close)] = 8;
    b["seed"] = 100 + i;
    bodies.push_back(b);
  }
  const auto replies = send_all(srv, "/v1/chat/completions", bodies);
  std::vector<json> lines;
  for (size_t i = 0; i < replies.size(); ++i) {
    const auto& r = replies[i];
    const json& schema = response_format ? bodies[i]["response_format"]["json_schema"]["schema"]
                                         : bodies[i]["json_schema"];
    ASSERT_EQ(r.status, 200) << r.body;
    const json& choice = r.j["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop") << r.body;
    if (choice["finish_reason"] != "stop") continue;
    const std::string content = choice["message"]["content"].get<std::string>();
    const json instance = json::parse(content, nullptr, false);
    ASSERT_FALSE(instance.is_discarded()) << "not JSON: " << content << " for " << schema.dump();
    if (bodies[i]["thinking"] == true) {
      EXPECT_TRUE(choice["message"].contains("reasoning_content") || !content.empty());
    }
    lines.push_back({{"id", fmt::format("{}#{}", i / kSamples, bodies[i]["seed"].get<int>())},
                     {"schema", schema},
                     {"instance", instance}});
  }
  expect_valid(lines, label);
}

void tools_validate(const std::string& model, const std::vector<std::string>& args,
                    const std::string& label) {
  test::ServerProcess srv(args, model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  const json configs = data("tools.json");
  const json bias = closing_bias(model);
  std::vector<json> bodies;
  for (const auto& c : configs) {
    for (int seed = 1; seed <= kSamples; ++seed) {
      bodies.push_back({{"messages", json::array({{{"role", "user"}, {"content", "Use a tool."}}})},
                        {"tools", c["tools"]},
                        {"tool_choice", c["tool_choice"]},
                        {"temperature", 1.0},
                        {"seed", seed},
                        {"max_tokens", 800},
                        {"logit_bias", bias},
                        {"thinking", false}});
    }
  }
  const auto replies = send_all(srv, "/v1/chat/completions", bodies);
  std::vector<json> lines;
  for (size_t i = 0; i < replies.size(); ++i) {
    const auto& r = replies[i];
    const json& cfg = configs[i / kSamples];
    ASSERT_EQ(r.status, 200) << r.body;
    const json& choice = r.j["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.body;
    const json& msg = choice["message"];
    ASSERT_TRUE(msg.contains("tool_calls") && msg["tool_calls"].is_array() &&
                !msg["tool_calls"].empty())
        << r.body;
    EXPECT_TRUE(msg["content"].is_null()) << r.body;
    for (const auto& call : msg["tool_calls"]) {
      EXPECT_EQ(call["type"], "function");
      EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
      const std::string name = call["function"]["name"];
      const json* params = nullptr;
      for (const auto& t : cfg["tools"])
        if (t["function"]["name"] == name) params = &t["function"]["parameters"];
      ASSERT_NE(params, nullptr) << "called an unknown function: " << r.body;
      if (cfg["tool_choice"].is_object()) {
        EXPECT_EQ(name, cfg["tool_choice"]["function"]["name"]);
      }
      const json a = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(a.is_object()) << r.body;
      lines.push_back(
          {{"id", fmt::format("{}:{}#{}", cfg["name"].get<std::string>(), name, i % kSamples + 1)},
           {"schema", *params},
           {"instance", a}});
    }
  }
  expect_valid(lines, label + "-tools");
}

bool pcre_matches(const std::string& pattern, const std::string& text) {
  int err;
  PCRE2_SIZE off;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()),
                                 PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, nullptr);
  EXPECT_NE(re, nullptr) << pattern;
  if (re == nullptr) return false;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  const int rc =
      pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return rc >= 0;
}

void grammars_match(const std::string& model, const std::vector<std::string>& args) {
  test::ServerProcess srv(args, model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  const json grammars = data("grammars.json");
  std::vector<json> bodies;
  for (const auto& g : grammars) {
    for (int seed = 1; seed <= kSamples; ++seed)
      bodies.push_back({{"prompt", "Output:"},
                        {"grammar", g["gbnf"]},
                        {"temperature", 1.0},
                        {"seed", seed},
                        {"max_tokens", 400}});
  }
  const auto replies = send_all(srv, "/v1/completions", bodies);
  for (size_t i = 0; i < replies.size(); ++i) {
    const auto& r = replies[i];
    const json& g = grammars[i / kSamples];
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j["choices"][0]["finish_reason"], "stop") << r.body;
    const std::string text = r.j["choices"][0]["text"];
    EXPECT_TRUE(pcre_matches(g["pcre"], text)) << g["name"] << ": `" << text << "`";
  }
}

const std::string& demo() {
  return test::demo_model_dir();
}

TEST(StructuredOutput, SchemasValidateOnTheDemoModel) {
  schemas_validate(demo(), {"--parallel", "8"}, "demo", true);
}
TEST(StructuredOutput, SchemasValidateOnATinyRandomModel) {
  schemas_validate(test::server_model_dir(), {"--parallel", "8", "--draft", "ngram"}, "tiny",
                   false);
}
TEST(StructuredOutput, ForcedToolCallsValidate) {
  tools_validate(demo(), {"--parallel", "8"}, "demo");
  tools_validate(test::server_model_dir(), {"--parallel", "8", "--draft", "ngram"}, "tiny");
}
TEST(StructuredOutput, GrammarOutputsMatchAnIndependentRecogniser) {
  grammars_match(demo(), {"--parallel", "8"});
  grammars_match(test::server_model_dir(), {"--parallel", "8", "--draft", "ngram"});
}

TEST(StructuredOutput, ConstrainedOutputIsIdenticalWithAndWithoutDrafting) {
  std::string schema;
  for (const auto& s : data("schemas.json"))
    if (s["name"] == "mixed-record") schema = s["schema"].dump();
  for (const char* temperature : {"0", "1"}) {
    std::vector<std::string> outputs;
    for (const std::string& draft : std::vector<std::string>{"none", "ngram", demo() + "/draft"}) {
      auto r =
          test::run_deltafin({"run", "--model", demo(), "--prompt", "The record:", "--json-schema",
                              schema, "--temperature", temperature, "--seed", "7", "--max-new",
                              "800", "--draft", draft, "--draft-max", "4", "--json"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const json j = json::parse(r.out);
      EXPECT_EQ(j["stop_reason"], "stop_token") << r.out;
      outputs.push_back(j["completion_ids"].dump());
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "ngram changed the output at temperature " << temperature;
    EXPECT_EQ(outputs[0], outputs[2])
        << "the draft model changed the output at temperature " << temperature;
  }
}

TEST(StructuredOutput, CliFlagsConstrainRunAndChatAndNameTheFlagOnErrors) {
  const std::string& model = test::server_model_dir();
  const std::string dir = test::temp_dir("structured-cli");
  {
    std::ofstream(dir + "/yesno.gbnf") << "root ::= (\"yes\" | \"no\") \" \" [0-9]{2}\n";
    std::ofstream(dir + "/schema.json")
        << R"({"type":"object","properties":{"n":{"type":"integer","minimum":3,"maximum":9}},"required":["n"],"additionalProperties":false})";
  }
  for (int seed = 1; seed <= 5; ++seed) {
    auto r = test::run_deltafin({"run", "--model", model, "--prompt", "Say:", "--grammar-file",
                                 dir + "/yesno.gbnf", "--temperature", "1", "--seed",
                                 std::to_string(seed), "--max-new", "40", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_TRUE(pcre_matches("^(yes|no) [0-9]{2}$", j["text"].get<std::string>())) << r.out;
    // --chat: the answer of the turn, thinking off.
    r = test::run_deltafin({"run", "--model", model, "--chat", "--think", "off", "--prompt", "n?",
                            "--json-schema", "@" + dir + "/schema.json", "--temperature", "1",
                            "--seed", std::to_string(seed), "--max-new", "200", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(json::parse(r.out)["text"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(a.is_object()) << r.out;
    EXPECT_GE(a["n"].get<int>(), 3) << r.out;
    EXPECT_LE(a["n"].get<int>(), 9) << r.out;
  }
  // `chat`: every turn's answer follows the schema, and later turns still reuse the kept state.
  auto c = test::run_deltafin(
      {"chat", "--model", model, "--think", "off", "--json-schema", "@" + dir + "/schema.json",
       "--temperature", "1", "--seed", "4", "--max-new", "200", "--stats"},
      "first\nsecond\nthird\n");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::regex answer(R"(\{\s*"n"\s*:\s*[3-9]\s*\})");
  EXPECT_EQ(std::distance(std::sregex_iterator(c.out.begin(), c.out.end(), answer),
                          std::sregex_iterator()),
            3)
      << c.out;
  const std::string rest = std::regex_replace(c.out, answer, "");
  EXPECT_EQ(rest.find_first_not_of(" \t\r\n"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("reused from the kept state"), std::string::npos) << c.err;
  // Errors name the flag.
  struct Bad {
    std::vector<std::string> flags;
    int code;
    std::string text;
  };
  const std::vector<Bad> bad = {
      {{"--json-schema", R"({"type":"array","uniqueItems":true})"},
       1,
       "--json-schema: unsupported keyword \"uniqueItems\""},
      {{"--json-schema", "{bad"}, 1, "--json-schema: not valid JSON"},
      {{"--grammar-file", dir + "/missing.gbnf"}, 1, "--grammar-file: "},
      {{"--grammar-file", dir + "/yesno.gbnf", "--json-schema", "{}"}, 2, "cannot be combined"},
  };
  for (const auto& b : bad) {
    std::vector<std::string> args = {"run", "--model", model, "--prompt", "x"};
    args.insert(args.end(), b.flags.begin(), b.flags.end());
    const auto r = test::run_deltafin(args);
    EXPECT_EQ(r.exit_code, b.code) << r.err;
    EXPECT_NE(r.err.find(b.text), std::string::npos) << r.err;
  }
}

TEST(StructuredOutput, BenchMeasuresDecodeWithAndWithoutTheConstraint) {
  const std::string& model = test::server_model_dir();
  const std::string schema = R"({"type":"object","properties":{"n":{"type":"integer"}}})";
  auto r = test::run_deltafin({"bench", "--model", model, "--json-schema", schema, "--reps", "2",
                               "--gen-tokens", "12", "--draft", "none", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["decode_tokens_per_s_reps"].size(), 2u) << r.out;
  EXPECT_EQ(j["constrained_decode_tokens_per_s_reps"].size(), 2u) << r.out;
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0) << r.out;
  EXPECT_GT(j["constrained_tokens"].get<int>(), 0) << r.out;
  EXPECT_EQ(j["tokens"], 24) << r.out;  // the free runs go to --gen-tokens
  EXPECT_GT(j["mask_us_per_token"].get<double>(), 0) << r.out;
  EXPECT_EQ(j["constraint"], "json_schema") << r.out;
  EXPECT_EQ(j["temperature"], 1.0) << r.out;
  // Greedy pairs: the same prompt and no draws, so every repetition repeats the same tokens.
  r = test::run_deltafin({"bench", "--model", model, "--json-schema", schema, "--reps", "2",
                          "--gen-tokens", "12", "--draft", "none", "--temperature", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json g = json::parse(r.out);
  EXPECT_EQ(g["temperature"], 0.0) << r.out;
  EXPECT_EQ(g["tokens"], 24) << r.out;
  EXPECT_EQ(g["constrained_tokens"].get<int>() % 2, 0) << r.out;
  r = test::run_deltafin({"bench", "--model", model, "--json-schema", schema, "--turns", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--turns and a constraint"), std::string::npos) << r.err;
  r = test::run_deltafin({"bench", "--model", model, "--temperature", "0.5"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--temperature applies to bench with --json-schema"), std::string::npos)
      << r.err;
}

// Prefix reuse concerns the prompt only: on a fresh server, the second turn of a constrained
// conversation continues from the snapshot its first turn kept (its answer re-rendered).
TEST(StructuredOutput, AConstrainedRequestReusesKeptSnapshots) {
  test::ServerProcess srv({}, test::server_model_dir());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client(600);
  json body = {
      {"messages", json::array({{{"role", "user"}, {"content", "Pick one."}}})},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "n"}, {"schema", {{"enum", json::array({"one", "two"})}}}}}}},
      {"thinking", false},
      {"temperature", 1.0},
      {"seed", 5},
      {"max_tokens", 20}};
  const auto r1 = test::post_json(*c, "/v1/chat/completions", body);
  ASSERT_EQ(r1.status, 200) << r1.body;
  EXPECT_EQ(r1.j["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r1.body;
  const std::string a1 = r1.j["choices"][0]["message"]["content"];
  EXPECT_TRUE(a1 == "\"one\"" || a1 == "\"two\"") << r1.body;
  body["messages"].push_back({{"role", "assistant"}, {"content", a1}});
  body["messages"].push_back({{"role", "user"}, {"content", "Again."}});
  const auto r2 = test::post_json(*c, "/v1/chat/completions", body);
  ASSERT_EQ(r2.status, 200) << r2.body;
  const std::string a2 = r2.j["choices"][0]["message"]["content"];
  EXPECT_TRUE(a2 == "\"one\"" || a2 == "\"two\"") << r2.body;
  EXPECT_GT(r2.j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << r2.body;
}

TEST(StructuredOutput, BadSchemasGrammarsAndToolChoicesAre400sNamingThem) {
  test::ServerProcess srv({}, test::server_model_dir());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  struct Bad {
    std::string body, param, text;
  };
  const std::vector<Bad> bad = {
      {R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array","uniqueItems":true}}}})",
       "response_format",
       "response_format.json_schema.schema: unsupported keyword \"uniqueItems\" (only false) at #"},
      {R"({"grammar":"root ::= root \"a\" | \"b\"\n"})", "grammar", "left-recursive"},
      {R"({"grammar":"root ::= foo\n"})", "grammar", "rule `foo` is used but never defined"},
      {R"({"json_schema":{"type":"string","minLength":5,"maxLength":2}})", "json_schema",
       "unsatisfiable"},
      {R"({"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice", "tool_choice: names function \"g\", which is not among the tools"},
      {R"({"grammar":"root ::= \"a\"\n","json_schema":{"type":"string"}})", "grammar",
       "cannot be combined"},
  };
  for (const auto& b : bad) {
    json body = json::parse(b.body);
    body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
    const auto r = test::post_json(*c, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_TRUE(test::is_error_shape(r.j)) << r.body;
    EXPECT_EQ(r.j["error"]["param"], b.param) << r.body;
    EXPECT_NE(r.j["error"]["message"].get<std::string>().find(b.text), std::string::npos) << r.body;
  }
  // A grammar that cannot finish within max_tokens ends with "length" and says so.
  const auto r =
      test::post_json(*c, "/v1/completions",
                      {{"prompt", "x"}, {"grammar", "root ::= \"a\"{50}\n"}, {"max_tokens", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "length");
  EXPECT_NE(r.j.value("warning", "").find("does not parse"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace deltafin
