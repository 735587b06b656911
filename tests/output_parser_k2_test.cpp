// The K2 family's output parser (tokenizer/output_parser_k2.cpp) through OutputParser, on token
// sequences of the synthetic K2 tokenizer: reasoning in <think>…</think> (K2-Thinking opens it
// itself, K2.5's prompt opens it), content, tool-call sections with `functions.NAME:IDX` ids
// (names with dots and colons), streamed arguments, a round trip through the K2 renderer, and
// malformed output kept as flagged text. Every sequence is fed as the tokenizer encodes it and
// byte by byte (markers aside), which splits every character, id and argument across tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "k2_tokenizer.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

using Kind = ParserEvent::Kind;
using json = nlohmann::ordered_json;

const Tokenizer& base() {
  static const Tokenizer t = Tokenizer::load(test::k2_tokenizer_dir());
  return t;
}

// One tokenizer value per format, alive for the whole run (parsers keep a pointer to it).
const Tokenizer& tok(ChatFormat f = ChatFormat::k2_thinking) {
  static const Tokenizer instruct = base().with_chat_format(ChatFormat::k2_instruct);
  static const Tokenizer thinking = base().with_chat_format(ChatFormat::k2_thinking);
  static const Tokenizer k25 = base().with_chat_format(ChatFormat::k2_5);
  return f == ChatFormat::k2_instruct ? instruct : f == ChatFormat::k2_5 ? k25 : thinking;
}

std::vector<int32_t> bpe_ids(const std::string& text) {
  return tok().encode_with_special(text);
}

std::vector<int32_t> byte_ids(const std::string& text) {
  std::vector<int32_t> out;
  for (const int32_t id : tok().encode_with_special(text)) {
    if (tok().is_special(id)) {
      out.push_back(id);
      continue;
    }
    for (const char c : tok().token_bytes(id)) out.push_back(*tok().rank_of(std::string(1, c)));
  }
  return out;
}

template <typename F>
void for_both_encodings(const std::string& text, F&& check) {
  {
    SCOPED_TRACE("bpe ids");
    check(bpe_ids(text));
  }
  {
    SCOPED_TRACE("byte ids");
    check(byte_ids(text));
  }
}

std::vector<ParserEvent> stream(const std::vector<int32_t>& ids, Channel start,
                                ChatFormat f = ChatFormat::k2_thinking) {
  OutputParser p(tok(f), start);
  std::vector<ParserEvent> events;
  for (const int32_t id : ids) p.push(id, events);
  p.finish(events);
  return events;
}

std::string joined(const std::vector<ParserEvent>& events, Kind kind, int index = -1) {
  std::string out;
  for (const auto& e : events) {
    if (e.kind == kind && (index < 0 || e.index == index)) out += e.text;
  }
  return out;
}

TEST(OutputParserK2, ThinkingThenContent) {
  for_both_encodings("<think>Let me think… about 2+2.</think>It is 4 — naïve. 🙂<|im_end|>",
                     [](const std::vector<int32_t>& ids) {
                       const auto events = stream(ids, Channel::think);
                       EXPECT_EQ(joined(events, Kind::reasoning), "Let me think… about 2+2.");
                       EXPECT_EQ(joined(events, Kind::content), "It is 4 — naïve. 🙂");
                       ASSERT_FALSE(events.empty());
                       EXPECT_EQ(events.back().kind, Kind::end_of_turn);
                       for (const auto& e : events) EXPECT_FALSE(e.malformed);
                     });
  // K2-Thinking's prompt opens nothing, so `start` does not put it in reasoning; generation
  // that stops inside the think block is all reasoning.
  const ParsedTurn cut = parse_all(tok(), bpe_ids("<think>still going"), Channel::response);
  EXPECT_EQ(cut.reasoning, "still going");
  EXPECT_FALSE(cut.ended);
  EXPECT_EQ(parse_all(tok(), bpe_ids("plain<|im_end|>"), Channel::think).content, "plain");
}

TEST(OutputParserK2, K25StartsInReasoningWhenThePromptOpenedIt) {
  const auto ids = bpe_ids("plan</think>done<|im_end|>");
  ParsedTurn t = parse_all(tok(ChatFormat::k2_5), ids, Channel::think);
  EXPECT_EQ(t.reasoning, "plan");
  EXPECT_EQ(t.content, "done");
  EXPECT_FALSE(t.malformed);
  // Thinking off: the prompt wrote <think></think>; a stray </think> is then flagged text.
  t = parse_all(tok(ChatFormat::k2_5), ids, Channel::response);
  EXPECT_EQ(t.content, "plan</think>done");
  EXPECT_TRUE(t.malformed);
  // K2-Instruct ignores `start` too.
  EXPECT_EQ(
      parse_all(tok(ChatFormat::k2_instruct), bpe_ids("hi<|im_end|>"), Channel::think).content,
      "hi");
}

TEST(OutputParserK2, ToolCallsWithIdsNamesAndStreamedArguments) {
  const std::string text =
      "<think>Two tools.</think>Checking.<|tool_calls_section_begin|>"
      "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\": \"São Paulo\", \"days\": 2}<|tool_call_end|>"
      "<|tool_call_begin|> functions.ns.lookup:v2:13 <|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|><|im_end|>";
  for_both_encodings(text, [](const std::vector<int32_t>& ids) {
    const auto events = stream(ids, Channel::think);
    EXPECT_EQ(joined(events, Kind::reasoning), "Two tools.");
    EXPECT_EQ(joined(events, Kind::content), "Checking.");
    std::vector<const ParserEvent*> begins, ends;
    for (const auto& e : events) {
      if (e.kind == Kind::tool_call_begin) begins.push_back(&e);
      if (e.kind == Kind::tool_call_end) ends.push_back(&e);
      EXPECT_FALSE(e.malformed);
    }
    ASSERT_EQ(begins.size(), 2u);
    ASSERT_EQ(ends.size(), 2u);
    EXPECT_EQ(begins[0]->name, "get_weather");
    EXPECT_EQ(begins[0]->id, "functions.get_weather:0");
    EXPECT_EQ(begins[0]->index, 0);
    // The name runs to the last colon; the id is trimmed.
    EXPECT_EQ(begins[1]->name, "ns.lookup:v2");
    EXPECT_EQ(begins[1]->id, "functions.ns.lookup:v2:13");
    EXPECT_EQ(ends[1]->id, begins[1]->id);
    // The deltas concatenate to the end event's text, which is what the model wrote.
    EXPECT_EQ(joined(events, Kind::tool_call_delta, 0), ends[0]->text);
    EXPECT_EQ(ends[0]->text, "{\"city\": \"São Paulo\", \"days\": 2}");
    EXPECT_EQ(ends[1]->text, "{}");
    EXPECT_EQ(events.back().kind, Kind::end_of_turn);
  });
  const ParsedTurn t = parse_all(tok(), bpe_ids(text), Channel::think);
  ASSERT_EQ(t.tool_calls.size(), 2u);
  EXPECT_EQ(t.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(json::parse(t.tool_calls[0].arguments)["city"], "São Paulo");
  EXPECT_TRUE(t.ended);
  EXPECT_FALSE(t.malformed);
}

TEST(OutputParserK2, ParsesWhatTheRendererWritesForAnOpenToolTurn) {
  const json req = json::parse(R"({"messages": [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "Both.", "reasoning_content": "Two cities, two calls.",
     "tool_calls": [
       {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
       {"id": "functions.get_weather:1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}],
    "add_generation_prompt": false})");
  const RenderedPrompt p = render_json(req, tok());
  // The assistant turn is everything after its <|im_middle|>.
  const int32_t middle = *tok().special_id("<|im_middle|>");
  const auto at = std::find(p.ids.rbegin(), p.ids.rend(), middle).base();
  const std::vector<int32_t> turn(at, p.ids.end());
  const ParsedTurn t = parse_all(tok(), turn, Channel::think);
  EXPECT_EQ(t.reasoning, "Two cities, two calls.");
  EXPECT_EQ(t.content, "Both.");
  ASSERT_EQ(t.tool_calls.size(), 2u);
  EXPECT_EQ(t.tool_calls[0].name, "get_weather");
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(t.tool_calls[1].id, "functions.get_weather:1");
  EXPECT_EQ(t.tool_calls[1].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_TRUE(t.ended);
  EXPECT_FALSE(t.malformed);
}

TEST(OutputParserK2, SectionsAnywhereAndEosEndsTheTurn) {
  // A section inside the think block ends the reasoning; a second section is accepted.
  const ParsedTurn t = parse_all(
      tok(),
      bpe_ids("<think>call now<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0"
              "<|tool_call_argument_begin|>{\"x\":1}<|tool_call_end|><|tool_calls_section_end|>"
              "\n<|tool_calls_section_begin|><|tool_call_begin|>functions.b:1"
              "<|tool_call_argument_begin|> <|tool_call_end|><|tool_calls_section_end|>[EOS]"),
      Channel::think);
  EXPECT_EQ(t.reasoning, "call now");
  ASSERT_EQ(t.tool_calls.size(), 2u);
  EXPECT_EQ(t.tool_calls[1].name, "b");
  EXPECT_EQ(t.tool_calls[1].arguments, " {}");  // blank arguments are an empty object
  EXPECT_TRUE(t.ended);
  EXPECT_FALSE(t.malformed);
}

TEST(OutputParserK2, MalformedOutputIsFlaggedNeverDropped) {
  // Stray structure in content: kept as text with its names.
  ParsedTurn t =
      parse_all(tok(), bpe_ids("a<|im_middle|>b<|im_user|></think>c<|im_end|>"), Channel::think);
  EXPECT_EQ(t.content, "a<|im_middle|>b<|im_user|></think>c");
  EXPECT_TRUE(t.malformed);
  EXPECT_TRUE(t.ended);
  // An id of another form: the call is flagged, its best-guess name kept.
  t = parse_all(tok(),
                bpe_ids("<|tool_calls_section_begin|><|tool_call_begin|>get_weather"
                        "<|tool_call_argument_begin|>{}<|tool_call_end|>"
                        "<|tool_calls_section_end|><|im_end|>"),
                Channel::think);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].name, "get_weather");
  EXPECT_TRUE(t.tool_calls[0].malformed);
  // Arguments that are not a JSON object: flagged, text kept.
  t = parse_all(tok(),
                bpe_ids("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                        "<|tool_call_argument_begin|>[1, 2<|tool_call_end|>"
                        "<|tool_calls_section_end|><|im_end|>"),
                Channel::think);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].arguments, "[1, 2");
  EXPECT_TRUE(t.tool_calls[0].malformed);
  // Text inside a section: the open call is ended (flagged) and the rest is flagged content.
  t = parse_all(tok(),
                bpe_ids("ok<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                        "<|tool_call_argument_begin|>{\"a\":<|im_system|>tail<|im_end|>"),
                Channel::think);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"a\":");
  EXPECT_TRUE(t.tool_calls[0].malformed);
  EXPECT_EQ(t.content, "ok<|im_system|>tail");
  EXPECT_TRUE(t.ended);
  // A call header cut by the end of the turn is text, and the open section flags the end.
  std::vector<ParserEvent> events =
      stream(bpe_ids("<|tool_calls_section_begin|><|tool_call_begin|>functions.f<|im_end|>"),
             Channel::think);
  EXPECT_EQ(joined(events, Kind::content), "<|tool_call_begin|>functions.f");
  ASSERT_EQ(events.back().kind, Kind::end_of_turn);
  EXPECT_TRUE(events.back().malformed);
  // Cut off by the length limit inside the arguments: the call ends flagged with what it has.
  t = parse_all(tok(),
                bpe_ids("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                        "<|tool_call_argument_begin|>{\"a\": 1"),
                Channel::think);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"a\": 1");
  EXPECT_TRUE(t.tool_calls[0].malformed);
  EXPECT_FALSE(t.ended);
}

TEST(OutputParserK2, NeverThrowsAndIgnoresIdsAfterTheEnd) {
  std::mt19937 rng(7);
  const int32_t n = tok().vocab_size();
  const int32_t first = tok().n_ranks();
  for (int round = 0; round < 200; ++round) {
    OutputParser p(tok(), round % 2 ? Channel::think : Channel::response);
    std::vector<ParserEvent> events;
    for (int k = 0; k < 60; ++k) {
      // Mostly structure, so every state is visited.
      const int32_t id = rng() % 2 ? first + static_cast<int32_t>(rng() % 24)
                                   : static_cast<int32_t>(rng() % static_cast<uint32_t>(n + 4)) - 2;
      EXPECT_NO_THROW(p.push(id, events));
    }
    EXPECT_NO_THROW(p.finish(events));
  }
  OutputParser p(tok(), Channel::response);
  std::vector<ParserEvent> events;
  for (const int32_t id : bpe_ids("x<|im_end|>y")) p.push(id, events);
  EXPECT_TRUE(p.ended());
  EXPECT_EQ(joined(events, Kind::content), "x");
}

TEST(OutputParserK2, PlainTextLeavesMessageHeadersOut) {
  PlainTextFilter f(tok());
  std::string out;
  for (const int32_t id :
       bpe_ids("A<|im_assistant|>assistant<|im_middle|>Hi <|tool_call_begin|>there<|im_end|>"))
    out += f.push(id);
  out += f.finish();
  EXPECT_EQ(out, "AHi there");
}

}  // namespace
}  // namespace deltafin
