// The K2 family's turn constraint (src/grammar/k2_turn.cpp, reached through turn_constraint by
// the tokenizer's chat format): whole assistant turns built from the synthetic K2 tokenizer's
// markers and text are accepted exactly when they have the format's structure (a think block
// where the format thinks, none where it does not) and the enforced content and arguments, and
// the output parser gets the answer and the calls back out of them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/k3_turn.h"
#include "k2_tokenizer.h"
#include "test_util.h"
#include "tokenizer/output_parser.h"

namespace deltafin::grammar {
namespace {

using json = nlohmann::ordered_json;

const Tokenizer& base() {
  static const Tokenizer t = Tokenizer::load(test::k2_tokenizer_dir());
  return t;
}

const Tokenizer& tok(ChatFormat f = ChatFormat::k2_thinking) {
  static const Tokenizer instruct = base().with_chat_format(ChatFormat::k2_instruct);
  static const Tokenizer thinking = base().with_chat_format(ChatFormat::k2_thinking);
  static const Tokenizer k25 = base().with_chat_format(ChatFormat::k2_5);
  static const Tokenizer linear = base().with_chat_format(ChatFormat::kimi_linear);
  switch (f) {
    case ChatFormat::k2_instruct:
      return instruct;
    case ChatFormat::k2_5:
      return k25;
    case ChatFormat::kimi_linear:
      return linear;
    default:
      return thinking;
  }
}

std::vector<int32_t> ids(const std::string& text) {
  return base().encode_with_special(text);
}

bool accepts(const Constraint& c, const std::vector<int32_t>& turn) {
  Matcher m(c.grammar, chat_stop_ids(base()), c.trigger);
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
  "days":{"type":"integer","minimum":1,"maximum":14}},"required":["city"]}}},
  {"type":"function","function":{"name":"note","parameters":{"type":"object",
  "properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}}}])");

const std::string kS = "<|tool_calls_section_begin|>", kSE = "<|tool_calls_section_end|>",
                  kC = "<|tool_call_begin|>", kA = "<|tool_call_argument_begin|>",
                  kCE = "<|tool_call_end|>", kEnd = "<|im_end|>";

std::string call(const std::string& id, const std::string& args) {
  return kC + id + kA + args + kCE;
}

TEST(K2Turn, ThinkBlockWhereTheFormatThinks) {
  TurnSpec spec;
  spec.thinking = true;
  spec.content = TurnSpec::Content::json_schema;
  spec.schema = json::parse(
      R"({"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"]})");
  // K2-Thinking writes <think> itself.
  const Constraint t = turn_constraint(spec, tok(ChatFormat::k2_thinking));
  const auto good = ids("<think>Let me think <about> it.\n</think>{\"answer\": 42}" + kEnd);
  EXPECT_TRUE(accepts(t, good));
  const ParsedTurn turn = parse_all(tok(), good, Channel::think);
  EXPECT_EQ(turn.reasoning, "Let me think <about> it.\n");
  EXPECT_EQ(turn.content, "{\"answer\": 42}");
  EXPECT_FALSE(turn.malformed);
  EXPECT_FALSE(accepts(t, ids("<think>x</think>{\"answer\": \"42\"}" + kEnd)));
  EXPECT_FALSE(accepts(t, ids("{\"answer\": 42}" + kEnd)));  // no think block
  EXPECT_FALSE(accepts(t, ids("<think>x" + kEnd)));
  EXPECT_FALSE(accepts(t, ids("<think>x" + kS)));
  // K2.5's prompt opened <think>: the turn starts inside it.
  const Constraint k25 = turn_constraint(spec, tok(ChatFormat::k2_5));
  EXPECT_TRUE(accepts(k25, ids("plan</think>{\"answer\": 1}" + kEnd)));
  EXPECT_FALSE(accepts(k25, ids("<think>plan</think>{\"answer\": 1}" + kEnd)));
  // K2-Instruct and Kimi-Linear never think: `thinking` does not add a block.
  for (const ChatFormat f : {ChatFormat::k2_instruct, ChatFormat::kimi_linear}) {
    const Constraint c = turn_constraint(spec, tok(f));
    EXPECT_TRUE(accepts(c, ids("{\"answer\": 7}" + kEnd)));
    EXPECT_FALSE(accepts(c, ids("<think>x</think>{\"answer\": 7}" + kEnd)));
  }
  // Thinking off in K2-Thinking: the prompt wrote <think></think>, the turn is the answer.
  spec.thinking = false;
  EXPECT_TRUE(accepts(turn_constraint(spec, tok()), ids("{\"answer\": 3}" + kEnd)));
  // The same spec compiles differently per format although the vocabulary is shared.
  spec.thinking = true;
  EXPECT_NE(turn_constraint(spec, tok(ChatFormat::k2_thinking)).grammar,
            turn_constraint(spec, tok(ChatFormat::k2_instruct)).grammar);
  // The old name dispatches the same way.
  EXPECT_TRUE(accepts(k3_turn_constraint(spec, tok(ChatFormat::k2_5)),
                      ids("plan</think>{\"answer\": 1}" + kEnd)));
}

TEST(K2Turn, RequiredToolCallArgumentsFollowTheSchema) {
  TurnSpec spec;
  spec.tools = kWeather;
  spec.calls = TurnSpec::Calls::required;
  spec.enforce_all_arguments = true;
  const Constraint c = turn_constraint(spec, tok(ChatFormat::k2_instruct));
  const std::string good =
      kS + call("functions.get_weather:0", R"({"city": "São Paulo", "days": 3})") +
      call("functions.note:1", R"({"text": "bring an \"umbrella\""})") + kSE + kEnd;
  EXPECT_TRUE(accepts(c, ids(good)));
  const ParsedTurn turn = parse_all(tok(ChatFormat::k2_instruct), ids(good), Channel::response);
  ASSERT_EQ(turn.tool_calls.size(), 2u);
  EXPECT_EQ(turn.tool_calls[0].name, "get_weather");
  EXPECT_EQ(turn.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(json::parse(turn.tool_calls[0].arguments),
            json::parse(R"({"city":"São Paulo","days":3})"));
  EXPECT_EQ(json::parse(turn.tool_calls[1].arguments)["text"], "bring an \"umbrella\"");
  EXPECT_FALSE(turn.malformed);
  const auto one = [&](const std::string& id, const std::string& args) {
    return ids(kS + call(id, args) + kSE + kEnd);
  };
  EXPECT_TRUE(accepts(c, one("functions.get_weather:12", R"({"city":"Oslo"})")));
  // Missing required city; days out of range; days as a string; an unknown key; an unknown
  // function; an id without its index or prefix; text before a forced call; no call at all.
  EXPECT_FALSE(accepts(c, one("functions.get_weather:0", R"({"days": 3})")));
  EXPECT_FALSE(accepts(c, one("functions.get_weather:0", R"({"city": "Oslo", "days": 15})")));
  EXPECT_FALSE(accepts(c, one("functions.get_weather:0", R"({"city": "Oslo", "days": "3"})")));
  EXPECT_FALSE(accepts(c, one("functions.note:0", R"({"text": "a", "town": "b"})")));
  EXPECT_FALSE(accepts(c, one("functions.get_time:0", R"({})")));
  EXPECT_FALSE(accepts(c, one("functions.get_weather", R"({"city":"Oslo"})")));
  EXPECT_FALSE(accepts(c, one("get_weather:0", R"({"city":"Oslo"})")));
  EXPECT_FALSE(
      accepts(c, ids("hi" + kS + call("functions.note:0", R"({"text":"x"})") + kSE + kEnd)));
  EXPECT_FALSE(accepts(c, ids("hi" + kEnd)));
  // With thinking (K2-Thinking): the think block, then the calls.
  spec.thinking = true;
  EXPECT_TRUE(accepts(turn_constraint(spec, tok()),
                      ids("<think>call it</think>" + kS +
                          call("functions.note:4", R"({"text":"x"})") + kSE + kEnd)));
}

TEST(K2Turn, OptionalNamedAndLazyCalls) {
  TurnSpec opt;
  opt.tools = kWeather;
  opt.calls = TurnSpec::Calls::optional;
  const Constraint o = turn_constraint(opt, tok(ChatFormat::kimi_linear));
  EXPECT_TRUE(accepts(o, ids("Just text." + kEnd)));
  // Not enforced (not strict): any JSON object.
  EXPECT_TRUE(accepts(o, ids("Let me check." + kS +
                             call("functions.get_weather:0", R"({"x": [1]})") + kSE + kEnd)));
  EXPECT_FALSE(accepts(o, ids(kS + call("functions.get_weather:0", "[1]") + kSE + kEnd)));
  EXPECT_FALSE(accepts(o, ids(kS + kSE + kEnd)));  // a section holds at least one call

  TurnSpec named;
  named.tools = kWeather;
  named.calls = TurnSpec::Calls::required;
  named.named = "note";
  named.enforce_all_arguments = true;
  const Constraint n = turn_constraint(named, tok(ChatFormat::k2_instruct));
  EXPECT_TRUE(accepts(n, ids(kS + call("functions.note:0", R"({"text":"x"})") + kSE + kEnd)));
  EXPECT_FALSE(
      accepts(n, ids(kS + call("functions.get_weather:0", R"({"city":"x"})") + kSE + kEnd)));
  named.named = "nope";
  EXPECT_THROW(turn_constraint(named, tok()), InvalidArgument);

  // Lazy: free text (markers included) until the section opens; then enforced.
  TurnSpec lazy;
  lazy.tools = json::parse(R"([{"type":"function","function":{"name":"f","strict":true,
    "parameters":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}])");
  lazy.calls = TurnSpec::Calls::optional;
  lazy.lazy = true;
  const Constraint l = turn_constraint(lazy, tok());
  ASSERT_EQ(l.trigger.size(), 1u);
  EXPECT_TRUE(accepts(l, ids("free <think> text</think>" + kEnd)));
  EXPECT_TRUE(accepts(l, ids("ok" + kS + call("functions.f:0", R"({"n": 7})") + kSE + kEnd)));
  EXPECT_FALSE(accepts(l, ids("ok" + kS + call("functions.f:0", R"({"n": 7.5})") + kSE + kEnd)));
  EXPECT_FALSE(accepts(l, ids("ok" + kS + call("functions.f:0", R"({"n": 7})") + kEnd)));
  // A function without parameters takes {} only.
  TurnSpec bare;
  bare.tools = json::parse(R"([{"type":"function","function":{"name":"ping"}}])");
  bare.calls = TurnSpec::Calls::required;
  bare.enforce_all_arguments = true;
  const Constraint b = turn_constraint(bare, tok(ChatFormat::k2_instruct));
  EXPECT_TRUE(accepts(b, ids(kS + call("functions.ping:0", "{}") + kSE + kEnd)));
  EXPECT_FALSE(accepts(b, ids(kS + call("functions.ping:0", R"({"a":1})") + kSE + kEnd)));
}

TEST(K2Turn, BadToolSchemasNameTheirField) {
  TurnSpec spec;
  spec.tools =
      json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
    "properties":{"a":{"type":"array","uniqueItems":true}}}}}])");
  spec.calls = TurnSpec::Calls::required;
  spec.enforce_all_arguments = true;
  try {
    turn_constraint(spec, tok());
    ADD_FAILURE() << "compiled";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "tools[0].function.parameters: unsupported keyword \"uniqueItems\" "
                  "(only false) at #/properties/a"),
              std::string::npos)
        << e.what();
  }
  spec.enforce_all_arguments = false;
  spec.calls = TurnSpec::Calls::optional;
  EXPECT_NO_THROW(turn_constraint(spec, tok()));
  // The K2 builder refuses a K3 tokenizer (turn_constraint would have picked K3's).
  const Tokenizer k3 = Tokenizer::load(test::data_dir() + "/tokenizer");
  EXPECT_THROW(k2_turn_constraint(spec, k3), InvalidArgument);
}

}  // namespace
}  // namespace deltafin::grammar
