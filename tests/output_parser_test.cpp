// Output parser tests: streamed thinking -> response, one and several tool calls (typed
// arguments and the `json` block form), a round trip through the chat renderer, UTF-8-safe
// streaming when every byte is its own token, and malformed output degrading to flagged text.
// Each sequence is fed twice: as the tokenizer would encode it, and byte by byte (markers
// aside), which splits every character and every tag header across tokens.
#include "tokenizer/output_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin {
namespace {

using Kind = ParserEvent::Kind;

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::load(test::data_dir() + "/tokenizer");
  return t;
}

std::vector<int32_t> bpe_ids(const std::string& text) {
  return tok().encode_with_special(text);
}

// Markers as special ids, every other byte its own single-byte token.
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

std::vector<ParserEvent> stream(const std::vector<int32_t>& ids, Channel start,
                                bool finish = true) {
  OutputParser p(tok(), start);
  std::vector<ParserEvent> events;
  for (const int32_t id : ids) p.push(id, events);
  if (finish) p.finish(events);
  return events;
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

TEST(OutputParser, StreamsThinkingThenResponse) {
  const std::string out =
      "Let me think about 世界 😀.<|close|>think<|sep|><|open|>response<|sep|>Hello 世界!\n"
      "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
  for_both_encodings(out, [](const std::vector<int32_t>& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::think);
    EXPECT_EQ(t.reasoning, "Let me think about 世界 😀.");
    EXPECT_EQ(t.content, "Hello 世界!\n");
    EXPECT_TRUE(t.tool_calls.empty());
    EXPECT_TRUE(t.ended);
    EXPECT_FALSE(t.malformed);
    // Event order: all reasoning, then content, then the end; every delta is valid UTF-8.
    const auto events = stream(ids, Channel::think);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().kind, Kind::end_of_turn);
    bool seen_content = false;
    for (const auto& e : events) {
      if (e.kind == Kind::content) seen_content = true;
      if (e.kind == Kind::reasoning) {
        EXPECT_FALSE(seen_content);
      }
      EXPECT_TRUE(utf8::is_valid(e.text));
      EXPECT_FALSE(e.malformed);
    }
  });
  // Byte-level ids stream reasoning in many small deltas, as they are generated.
  const auto events = stream(byte_ids(out), Channel::think);
  EXPECT_GT(std::count_if(events.begin(), events.end(),
                          [](const auto& e) { return e.kind == Kind::reasoning; }),
            10);
}

TEST(OutputParser, ThinkingOffAndEndOfMessageAlone) {
  for_both_encodings("Hi there<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
                     [](const auto& ids) {
                       const ParsedTurn t = parse_all(tok(), ids, Channel::response);
                       EXPECT_EQ(t.content, "Hi there");
                       EXPECT_EQ(t.reasoning, "");
                       EXPECT_TRUE(t.ended);
                       EXPECT_FALSE(t.malformed);
                     });
  for_both_encodings("Just text<|end_of_msg|>", [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    EXPECT_EQ(t.content, "Just text");
    EXPECT_TRUE(t.ended);
    EXPECT_FALSE(t.malformed);
  });
  for_both_encodings("thinking only<|end_of_msg|>", [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::think);
    EXPECT_EQ(t.reasoning, "thinking only");
    EXPECT_TRUE(t.ended);
    EXPECT_FALSE(t.malformed);
  });
  // A stream cut short (length limit) is not malformed, just not ended.
  for_both_encodings("partial reason", [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::think);
    EXPECT_EQ(t.reasoning, "partial reason");
    EXPECT_FALSE(t.ended);
    EXPECT_FALSE(t.malformed);
  });
}

const std::string kOneCall =
    "Need weather.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"FR\" 🇫🇷\n<|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
    "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"units\": \"metric\", \"a\": [1, "
    "2.50]}<|close|>argument<|sep|>"
    "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

TEST(OutputParser, OneToolCallWithTypedArguments) {
  for_both_encodings(kOneCall, [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::think);
    EXPECT_EQ(t.reasoning, "Need weather.");
    EXPECT_EQ(t.content, "Checking.");
    ASSERT_EQ(t.tool_calls.size(), 1u);
    EXPECT_EQ(t.tool_calls[0].name, "get_weather");
    EXPECT_EQ(t.tool_calls[0].arguments,
              "{\"city\":\"Paris \\\"FR\\\" "
              "🇫🇷\\n\",\"days\":3,\"opts\":{\"units\":\"metric\",\"a\":[1,2.5]}}");
    EXPECT_FALSE(t.tool_calls[0].malformed);
    EXPECT_TRUE(t.ended);
    EXPECT_FALSE(t.malformed);
    // Streaming: begin, then fragments that concatenate to the arguments, then end.
    const auto events = stream(ids, Channel::think);
    std::string joined;
    int begins = 0, ends = 0;
    for (const auto& e : events) {
      if (e.kind == Kind::tool_call_begin) {
        ++begins;
        EXPECT_EQ(e.name, "get_weather");
        EXPECT_EQ(e.index, 0);
        EXPECT_TRUE(joined.empty());
      }
      if (e.kind == Kind::tool_call_delta) {
        EXPECT_EQ(begins, 1);
        EXPECT_EQ(ends, 0);
        joined += e.text;
      }
      if (e.kind == Kind::tool_call_end) {
        ++ends;
        EXPECT_EQ(e.text, joined);
      }
    }
    EXPECT_EQ(begins, 1);
    EXPECT_EQ(ends, 1);
    EXPECT_EQ(joined, t.tool_calls[0].arguments);
    EXPECT_TRUE(nlohmann::json::parse(joined).is_object());
  });
  // A string argument streams while it is generated (byte ids: many fragments).
  const auto events = stream(byte_ids(kOneCall), Channel::think);
  EXPECT_GT(std::count_if(events.begin(), events.end(),
                          [](const auto& e) { return e.kind == Kind::tool_call_delta; }),
            8);
}

TEST(OutputParser, SeveralToolCallsAndTheJsonBlockForm) {
  const std::string out =
      "<|open|>tools<|sep|>"
      "<|open|>call tool=\"a\" index=\"1\"<|sep|><|open|>argument key=\"on\" "
      "type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
      "<|open|>argument key=\"x\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
      "<|open|>argument key=\"l\" type=\"array\"<|sep|>[\"p\", {\"q\": "
      "1}]<|close|>argument<|sep|><|close|>call<|sep|>"
      "<|open|>call tool=\"b&amp;&quot;c&quot;\" index=\"2\"<|sep|><|open|>json "
      "type=\"object\"<|sep|>{\"z\": \"x\", \"n\": -2e3}"
      "<|close|>json<|sep|><|close|>call<|sep|>"
      "<|open|>call tool=\"empty\" index=\"3\"<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  for_both_encodings(out, [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    ASSERT_EQ(t.tool_calls.size(), 3u);
    EXPECT_EQ(t.tool_calls[0].name, "a");
    EXPECT_EQ(t.tool_calls[0].arguments, "{\"on\":true,\"x\":null,\"l\":[\"p\",{\"q\":1}]}");
    EXPECT_EQ(t.tool_calls[1].name, "b&\"c\"");
    EXPECT_EQ(t.tool_calls[1].arguments, "{\"z\":\"x\",\"n\":-2000.0}");
    EXPECT_EQ(t.tool_calls[2].name, "empty");
    EXPECT_EQ(t.tool_calls[2].arguments, "{}");
    EXPECT_EQ(t.content, "");
    EXPECT_TRUE(t.ended);
    EXPECT_FALSE(t.malformed);
    std::vector<int> indexes;
    for (const auto& e : stream(ids, Channel::response)) {
      if (e.kind == Kind::tool_call_end) indexes.push_back(e.index);
    }
    EXPECT_EQ(indexes, (std::vector<int>{0, 1, 2}));
  });
}

TEST(OutputParser, ParsesWhatTheRendererWritesForAPastTurn) {
  const nlohmann::ordered_json req =
      nlohmann::ordered_json::parse(R"({"add_generation_prompt": false, "messages": [
    {"role": "assistant", "reasoning_content": "Plan: call both.", "content": "On it — 好的.",
     "tool_calls": [
       {"id": "1", "function": {"name": "search", "arguments": {"query": "k3 <|open|> tokens", "limit": 5, "f": {"b": [true]}}}},
       {"id": "2", "function": {"name": "raw", "arguments": "not an object"}}]}]})");
  const RenderedPrompt p = render_json(req, tok());
  // Drop the renderer's effort message and the assistant header + <|open|>think<|sep|>, which
  // the generation prompt would have written.
  const std::vector<int32_t> head =
      tok().encode_with_special("<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  const auto at = std::search(p.ids.begin(), p.ids.end(), head.begin(), head.end());
  ASSERT_NE(at, p.ids.end());
  const std::vector<int32_t> generated(at + static_cast<std::ptrdiff_t>(head.size()), p.ids.end());
  const ParsedTurn t = parse_all(tok(), generated, Channel::think);
  EXPECT_EQ(t.reasoning, "Plan: call both.");
  // The raw `json` block is not an object: its text lands in the content (flagged).
  EXPECT_EQ(t.content, "On it — 好的.not an object");
  ASSERT_EQ(t.tool_calls.size(), 2u);
  EXPECT_EQ(t.tool_calls[0].name, "search");
  EXPECT_EQ(t.tool_calls[0].arguments,
            "{\"query\":\"k3 <|open|> tokens\",\"limit\":5,\"f\":{\"b\":[true]}}");
  EXPECT_EQ(t.tool_calls[1].name, "raw");
  EXPECT_EQ(t.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(t.tool_calls[1].malformed);
  EXPECT_TRUE(t.ended);
}

// ---------------------------------------------------------------------------------------------
// Malformed output.

TEST(OutputParser, UnknownTagsAndStraySpecialsBecomeFlaggedText) {
  for_both_encodings(
      "A<|open|>foo x=\"1\"<|sep|>B<|sep|>C[EOS]<|close|>think<|sep|>D<|close|>response<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>",
      [](const auto& ids) {
        const ParsedTurn t = parse_all(tok(), ids, Channel::response);
        EXPECT_EQ(t.content, "A<|open|>foo x=\"1\"<|sep|>B<|sep|>C[EOS]<|close|>think<|sep|>D");
        EXPECT_TRUE(t.malformed);
        EXPECT_TRUE(t.ended);
      });
  // In the thinking channel the text stays reasoning.
  for_both_encodings(
      "r1<|open|>response "
      "r<|sep|>r2[BOS]<|close|>think<|sep|><|open|>response<|sep|>ok<|end_of_msg|>",
      [](const auto& ids) {
        const ParsedTurn t = parse_all(tok(), ids, Channel::think);
        EXPECT_EQ(t.reasoning, "r1<|open|>response r<|sep|>r2[BOS]");
        EXPECT_EQ(t.content, "ok");
        EXPECT_TRUE(t.malformed);
      });
  // A marker inside a tag header ends the header: both become text.
  for_both_encodings("x<|close|>resp<|open|>oops<|end_of_msg|>", [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    EXPECT_EQ(t.content, "x<|close|>resp<|open|>oops");
    EXPECT_TRUE(t.ended);
    EXPECT_TRUE(t.malformed);
  });
}

TEST(OutputParser, TextBetweenBlocks) {
  // Blank text between tags is harmless; other text goes to the content, flagged.
  for_both_encodings(
      "r<|close|>think<|sep|>\n<|open|>response<|sep|>ok<|close|>response<|sep|>\n<|close|>message<"
      "|sep|><|end_of_msg|>",
      [](const auto& ids) {
        const ParsedTurn t = parse_all(tok(), ids, Channel::think);
        EXPECT_EQ(t.content, "ok");
        EXPECT_FALSE(t.malformed);
      });
  for_both_encodings("r<|close|>think<|sep|>junk<|open|>response<|sep|>ok<|end_of_msg|>",
                     [](const auto& ids) {
                       const ParsedTurn t = parse_all(tok(), ids, Channel::think);
                       EXPECT_EQ(t.content, "junkok");
                       EXPECT_TRUE(t.malformed);
                     });
}

TEST(OutputParser, BadArgumentValuesKeepTheTextAndFlagTheCall) {
  const std::string out =
      "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>three<|close|>argument<|sep|>"
      "<|open|>argument key=\"o\" type=\"object\"<|sep|>[1]<|close|>argument<|sep|>"
      "<|open|>argument key=\"u\" type=\"integer\"<|sep|>7<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json "
      "type=\"object\"<|sep|>{broken"
      "<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_"
      "of_msg|>";
  for_both_encodings(out, [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    ASSERT_EQ(t.tool_calls.size(), 2u);
    EXPECT_EQ(t.tool_calls[0].arguments, "{\"n\":\"three\",\"o\":\"[1]\",\"u\":7}");
    EXPECT_TRUE(t.tool_calls[0].malformed);
    EXPECT_EQ(t.tool_calls[1].arguments, "{}");
    EXPECT_TRUE(t.tool_calls[1].malformed);
    EXPECT_EQ(t.content, "{broken");
    EXPECT_TRUE(t.ended);
    EXPECT_TRUE(t.malformed);
  });
}

TEST(OutputParser, BrokenStructureInsideToolsDegradesToContent) {
  const std::string out =
      "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"a\" type=\"string\"<|sep|>ok<|close|>argument<|sep|>"
      "<|open|>weird<|sep|>rest of it<|open|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  for_both_encodings(out, [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    ASSERT_EQ(t.tool_calls.size(), 1u);
    EXPECT_EQ(t.tool_calls[0].arguments, "{\"a\":\"ok\"}");  // what was valid is kept
    EXPECT_TRUE(t.tool_calls[0].malformed);
    EXPECT_EQ(t.content, "<|open|>weird<|sep|>rest of it<|open|>tools<|sep|>");
    EXPECT_TRUE(t.ended);
    EXPECT_TRUE(t.malformed);
  });
  // Text where only tags belong.
  for_both_encodings("<|open|>tools<|sep|>oops<|close|>tools<|sep|><|end_of_msg|>",
                     [](const auto& ids) {
                       const ParsedTurn t = parse_all(tok(), ids, Channel::response);
                       EXPECT_TRUE(t.tool_calls.empty());
                       EXPECT_EQ(t.content, "oops<|close|>tools<|sep|>");
                       EXPECT_TRUE(t.malformed);
                     });
  // A call header without the tool attribute.
  for_both_encodings("<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|>x<|end_of_msg|>",
                     [](const auto& ids) {
                       const ParsedTurn t = parse_all(tok(), ids, Channel::response);
                       EXPECT_TRUE(t.tool_calls.empty());
                       EXPECT_EQ(t.content, "<|open|>call index=\"1\"<|sep|>x");
                       EXPECT_TRUE(t.ended);
                       EXPECT_TRUE(t.malformed);
                     });
}

TEST(OutputParser, UnclosedCallsAtTheEnd) {
  // <|end_of_msg|> in the middle of a string argument: the call ends flagged, the value kept.
  for_both_encodings(
      "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"s\" type=\"string\"<|sep|>half<|end_of_msg|>",
      [](const auto& ids) {
        const ParsedTurn t = parse_all(tok(), ids, Channel::response);
        ASSERT_EQ(t.tool_calls.size(), 1u);
        EXPECT_EQ(t.tool_calls[0].arguments, "{\"s\":\"half\"}");
        EXPECT_TRUE(t.tool_calls[0].malformed);
        EXPECT_TRUE(t.ended);
        EXPECT_TRUE(t.malformed);
      });
  // The stream stops inside a number argument.
  for_both_encodings(
      "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>12",
      [](const auto& ids) {
        const ParsedTurn t = parse_all(tok(), ids, Channel::response);
        ASSERT_EQ(t.tool_calls.size(), 1u);
        EXPECT_EQ(t.tool_calls[0].arguments, "{\"n\":12}");
        EXPECT_TRUE(t.tool_calls[0].malformed);
        EXPECT_FALSE(t.ended);
      });
  // The stream stops in a tag header (a length limit): structure that never finished is
  // dropped, never content (issue 31 B3: it used to show as "done<|close|>resp").
  for_both_encodings("done<|close|>resp", [](const auto& ids) {
    const ParsedTurn t = parse_all(tok(), ids, Channel::response);
    EXPECT_EQ(t.content, "done");
    EXPECT_FALSE(t.malformed);
    EXPECT_FALSE(t.ended);
  });
}

TEST(OutputParser, NeverThrowsAndIgnoresIdsAfterTheEnd) {
  OutputParser p(tok(), Channel::response);
  std::vector<ParserEvent> ev;
  p.push(-5, ev);
  p.push(tok().vocab_size(), ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_TRUE(p.malformed());
  // An over-long tag header is released as text.
  std::vector<int32_t> ids = {*tok().special_id("<|open|>")};
  for (int i = 0; i < 1500; ++i) ids.push_back(*tok().rank_of("a"));
  for (const int32_t id : ids) p.push(id, ev);
  p.push(*tok().special_id("<|end_of_msg|>"), ev);
  EXPECT_TRUE(p.ended());
  std::string content;
  for (const auto& e : ev) {
    if (e.kind == Kind::content) content += e.text;
  }
  EXPECT_EQ(content, "<|open|>" + std::string(1500, 'a'));
  const std::size_t n = ev.size();
  p.push(*tok().rank_of("a"), ev);
  p.finish(ev);
  EXPECT_EQ(ev.size(), n);
  // Incomplete UTF-8 at the end of the stream comes out as U+FFFD.
  const ParsedTurn t = parse_all(
      tok(), std::vector<int32_t>{*tok().rank_of("x"), *tok().rank_of("\xe4")}, Channel::think);
  EXPECT_EQ(t.reasoning, "x\xEF\xBF\xBD");
  // Random id soup: no exception, every text event is valid UTF-8.
  std::mt19937 rng(5);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<int32_t> soup;
    for (int i = 0; i < 60; ++i) {
      soup.push_back(rng() % 3 == 0 ? 100256 + static_cast<int32_t>(rng() % 8)
                                    : static_cast<int32_t>(rng() % 100256));
    }
    for (const auto& e : stream(soup, iter % 2 ? Channel::think : Channel::response)) {
      EXPECT_TRUE(utf8::is_valid(e.text));
      if (e.kind == Kind::tool_call_end) {
        EXPECT_TRUE(nlohmann::json::parse(e.text, nullptr, false).is_object()) << e.text;
      }
    }
  }
}

}  // namespace
}  // namespace deltafin
