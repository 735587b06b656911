// The K3 turn constraint (src/grammar/k3_turn.*): whole assistant turns built from the real
// markers and the test tokenizer's text tokens are accepted exactly when they have the XTML
// structure and the enforced content and arguments, and the output parser (an independent
// reader of the same format) gets the answer and the tool calls back out of them.
#include "grammar/k3_turn.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"

namespace deltafin::grammar {
namespace {

using json = nlohmann::ordered_json;

const Tokenizer& tok() {
  return test::k3_tokenizer();
}

// Builds ids from pieces: "<|open|>" etc. are the specials, anything else ordinary text.
std::vector<int32_t> ids(const std::vector<std::string>& pieces) {
  std::vector<int32_t> out;
  for (const auto& p : pieces) {
    if (const auto s = tok().special_id(p); s && p.size() > 2 && p[0] == '<' && p[1] == '|') {
      out.push_back(*s);
    } else {
      tok().encode_ordinary_append(p, out);
    }
  }
  return out;
}

const std::string O = kOpenMarker, C = kCloseMarker, S = kSepMarker, E = kEndOfMsgMarker;

// Every id allowed by the mask (and agreed by the direct check) and the grammar complete.
bool accepts(const Constraint& c, const std::vector<int32_t>& turn) {
  const int32_t eom = tok().special_id(kEndOfMsgMarker).value();
  Matcher m(c.grammar, {eom}, c.trigger);
  TokenMask mask;
  for (const int32_t t : turn) {
    m.fill_mask(mask);
    EXPECT_EQ(mask.test(t), m.allows(t));
    if (!mask.test(t) || !m.accept(t)) return false;
  }
  return m.finished() || m.complete();
}

const json kWeather = json::parse(R"([{"type":"function","function":{"name":"get_weather",
  "parameters":{"type":"object","properties":{"city":{"type":"string","minLength":1},
  "days":{"type":"integer","minimum":1,"maximum":14},"units":{"enum":["C","F"]}},
  "required":["city"]}}},
  {"type":"function","function":{"name":"note","parameters":{"type":"object",
  "properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}}}])");

TEST(K3Turn, ThinkingThenSchemaContent) {
  TurnSpec spec;
  spec.thinking = true;
  spec.content = TurnSpec::Content::json_schema;
  spec.schema = json::parse(
      R"({"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"]})");
  const Constraint c = k3_turn_constraint(spec, tok());
  const auto good = ids({"Let me think <about> it.\n", C, "think", S, O, "response", S,
                         R"({"answer": 42})", C, "response", S, C, "message", S, E});
  EXPECT_TRUE(accepts(c, good));
  const ParsedTurn turn = parse_all(tok(), good, Channel::think);
  EXPECT_EQ(turn.content, R"({"answer": 42})");
  EXPECT_FALSE(turn.malformed);
  // Not JSON of the schema; the turn ended early; a stray marker in the thinking.
  EXPECT_FALSE(accepts(c, ids({"x", C, "think", S, O, "response", S, R"({"answer": "42"})", C,
                               "response", S, C, "message", S, E})));
  EXPECT_FALSE(accepts(c, ids({"x", C, "message", S, E})));
  EXPECT_FALSE(accepts(c, ids({"x", O, "tools", S})));
}

TEST(K3Turn, RequiredToolCallArgumentsFollowTheSchema) {
  TurnSpec spec;
  spec.tools = kWeather;
  spec.calls = TurnSpec::Calls::required;
  spec.enforce_all_arguments = true;
  const Constraint c = k3_turn_constraint(spec, tok());
  const auto good = ids({C,
                         "response",
                         S,
                         O,
                         "tools",
                         S,
                         O,
                         R"(call tool="get_weather" index="1")",
                         S,
                         O,
                         R"(argument key="city" type="string")",
                         S,
                         "São Paulo",
                         C,
                         "argument",
                         S,
                         O,
                         R"(argument key="days" type="number")",
                         S,
                         "3",
                         C,
                         "argument",
                         S,
                         C,
                         "call",
                         S,
                         O,
                         R"(call tool="note" index="2")",
                         S,
                         O,
                         R"(argument key="text" type="string")",
                         S,
                         "bring an \"umbrella\"",
                         C,
                         "argument",
                         S,
                         C,
                         "call",
                         S,
                         C,
                         "tools",
                         S,
                         C,
                         "message",
                         S,
                         E});
  EXPECT_TRUE(accepts(c, good));
  const ParsedTurn turn = parse_all(tok(), good, Channel::response);
  ASSERT_EQ(turn.tool_calls.size(), 2u);
  EXPECT_EQ(turn.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(turn.tool_calls[0].arguments),
            json::parse(R"({"city":"São Paulo","days":3})"));
  EXPECT_EQ(json::parse(turn.tool_calls[1].arguments),
            json::parse(R"({"text":"bring an \"umbrella\""})"));
  EXPECT_FALSE(turn.malformed);
  auto call = [&](const std::vector<std::string>& args) {
    std::vector<std::string> p = {
        C, "response", S, O, "tools", S, O, R"(call tool="get_weather" index="1")", S};
    p.insert(p.end(), args.begin(), args.end());
    for (const auto& x :
         {C, std::string("call"), S, C, std::string("tools"), S, C, std::string("message"), S, E})
      p.push_back(x);
    return ids(p);
  };
  EXPECT_TRUE(
      accepts(c, call({O, R"(argument key="city" type="string")", S, "Oslo", C, "argument", S})));
  // Missing required city; days out of range; days as a string; an unknown key; no call at all.
  EXPECT_FALSE(
      accepts(c, call({O, R"(argument key="days" type="number")", S, "3", C, "argument", S})));
  EXPECT_FALSE(
      accepts(c, call({O, R"(argument key="city" type="string")", S, "Oslo", C, "argument", S, O,
                       R"(argument key="days" type="number")", S, "15", C, "argument", S})));
  EXPECT_FALSE(
      accepts(c, call({O, R"(argument key="city" type="string")", S, "Oslo", C, "argument", S, O,
                       R"(argument key="days" type="string")", S, "3", C, "argument", S})));
  EXPECT_FALSE(
      accepts(c, call({O, R"(argument key="town" type="string")", S, "Oslo", C, "argument", S})));
  EXPECT_FALSE(accepts(c, ids({"hi", C, "response", S, C, "message", S, E})));
}

TEST(K3Turn, NamedFunctionAndLazyCalls) {
  TurnSpec named;
  named.tools = kWeather;
  named.calls = TurnSpec::Calls::required;
  named.named = "note";
  named.enforce_all_arguments = true;
  const Constraint c = k3_turn_constraint(named, tok());
  EXPECT_FALSE(accepts(c, ids({C,
                               "response",
                               S,
                               O,
                               "tools",
                               S,
                               O,
                               R"(call tool="get_weather" index="1")",
                               S,
                               O,
                               R"(argument key="city" type="string")",
                               S,
                               "Oslo",
                               C,
                               "argument",
                               S,
                               C,
                               "call",
                               S,
                               C,
                               "tools",
                               S,
                               C,
                               "message",
                               S,
                               E})));
  EXPECT_TRUE(accepts(c, ids({C,
                              "response",
                              S,
                              O,
                              "tools",
                              S,
                              O,
                              R"(call tool="note" index="1")",
                              S,
                              O,
                              R"(argument key="text" type="string")",
                              S,
                              "x",
                              C,
                              "argument",
                              S,
                              C,
                              "call",
                              S,
                              C,
                              "tools",
                              S,
                              C,
                              "message",
                              S,
                              E})));
  named.named = "nope";
  EXPECT_THROW(k3_turn_constraint(named, tok()), InvalidArgument);

  // Lazy: free text (markers included) until the tools block opens; then enforced.
  TurnSpec lazy;
  lazy.tools = json::parse(R"([{"type":"function","function":{"name":"f","strict":true,
    "parameters":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}])");
  lazy.calls = TurnSpec::Calls::optional;
  lazy.lazy = true;
  const Constraint l = k3_turn_constraint(lazy, tok());
  EXPECT_FALSE(l.trigger.empty());
  EXPECT_TRUE(accepts(l, ids({"free <|open|> text", C, "response", S, C, "message", S, E})));
  const auto head = std::vector<std::string>{
      "ok", C, "response", S, O, "tools", S, O, R"(call tool="f" index="1")", S, O};
  auto with = [&](const std::string& type, const std::string& v) {
    auto p = head;
    for (const auto& x :
         {"argument key=\"n\" type=\"" + type + "\"", S, v, C, std::string("argument"), S, C,
          std::string("call"), S, C, std::string("tools"), S, C, std::string("message"), S, E})
      p.push_back(x);
    return ids(p);
  };
  EXPECT_TRUE(accepts(l, with("number", "7")));
  EXPECT_FALSE(accepts(l, with("number", "7.5")));
  EXPECT_FALSE(accepts(l, with("string", "7")));
}

TEST(K3Turn, BadToolSchemasNameTheirField) {
  TurnSpec spec;
  spec.tools =
      json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
    "properties":{"a":{"type":"array","uniqueItems":true}}}}}])");
  spec.calls = TurnSpec::Calls::required;
  spec.enforce_all_arguments = true;
  try {
    k3_turn_constraint(spec, tok());
    ADD_FAILURE() << "compiled";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "tools[0].function.parameters: unsupported keyword \"uniqueItems\" "
                  "(only false) at #/properties/a"),
              std::string::npos)
        << e.what();
  }
  // Not enforced (auto, not strict): the same schema is not compiled, any arguments are allowed.
  spec.enforce_all_arguments = false;
  spec.calls = TurnSpec::Calls::optional;
  EXPECT_NO_THROW(k3_turn_constraint(spec, tok()));
}

}  // namespace
}  // namespace deltafin::grammar
