// Fuzz bodies for text in and out of the model: the tokenizer (arbitrary bytes in; valid UTF-8
// must round-trip through encode and decode; arbitrary ids out through the streaming decoder),
// the chat renderer (a request body, as the `render` command and the server parse it) and the
// model-output parser (arbitrary id sequences, with the four XTML markers made common).
// All run on the real K3 test tokenizer (tests/data/tokenizer), loaded once.
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_targets.h"
#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/chat.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deltafin::fuzz {

namespace {

const Tokenizer& test_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test_data_dir() + "/tokenizer");
  return tok;
}

// Two bytes per id; the top bits pick a marker, a special, a low rank or any id, so that
// structure (tags, separators, end of message) shows up often in random inputs.
std::vector<int32_t> ids_from(const uint8_t* data, size_t size, const Tokenizer& tok) {
  static const char* kMarkers[] = {kOpenMarker, kCloseMarker, kSepMarker, kEndOfMsgMarker};
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const unsigned v = static_cast<unsigned>(data[i]) << 8 | data[i + 1];
    switch (v >> 14) {
      case 0:
        ids.push_back(tok.special_id(kMarkers[v & 3]).value());
        break;
      case 1:
        ids.push_back(tok.n_ranks() + static_cast<int32_t>(v % Tokenizer::kNumSpecial));
        break;
      case 2:
        ids.push_back(static_cast<int32_t>(v & 0x3fff));
        break;
      default:
        ids.push_back(static_cast<int32_t>((v * 2654435761u) % tok.vocab_size()));
    }
  }
  return ids;
}

}  // namespace

void tokenizer(const uint8_t* data, size_t size) {
  const Tokenizer& tok = test_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto ids = tok.encode_ordinary(text);
    for (int32_t id : ids) fuzz_check(!tok.is_special(id), "ordinary text encoded to a special");
    if (utf8::is_valid(text))
      fuzz_check(tok.decode(ids) == text, "valid UTF-8 does not round-trip");
    const auto with_special = tok.encode_with_special(text);
    if (utf8::is_valid(text))
      fuzz_check(tok.decode(with_special) == text, "encode_with_special does not round-trip");
  } catch (const Error&) {
    // The reference refuses some inputs (its guards); refusing is allowed, crashing is not.
  }
  // The bytes as ids: the streaming decoder's output is always valid UTF-8 and equals the lossy
  // decoding of the whole sequence.
  const auto ids = ids_from(data, size, tok);
  IncrementalDecoder dec(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += dec.push(id);
  streamed += dec.flush();
  fuzz_check(utf8::is_valid(streamed), "the streaming decoder produced invalid UTF-8");
  fuzz_check(streamed == utf8::sanitize(tok.decode(ids)),
             "the streaming decoder disagrees with decode()");
}

// First byte even: the rest is a chat request body for the renderer (JSON, parsed with the
// server's depth limit); odd: the rest is a generated id sequence for the output parser.
void chat(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const Tokenizer& tok = test_tokenizer();
  const bool output = (data[0] & 1) != 0;
  const Channel start = (data[0] & 2) != 0 ? Channel::think : Channel::response;
  ++data, --size;
  if (!output) {
    try {
      const auto body =
          server::parse_body(std::string(reinterpret_cast<const char*>(data), size), 64);
      const RenderedPrompt p = render_json(body, tok);
      fuzz_check(tok.decode(p.ids) == p.text, "rendered ids do not decode to the rendered text");
    } catch (const Error&) {
    } catch (const server::ApiError&) {
    }
    return;
  }
  const auto ids = ids_from(data, size, tok);
  OutputParser parser(tok, start);
  std::vector<ParserEvent> events;
  for (int32_t id : ids) {
    parser.push(id, events);
    if (parser.ended()) break;
  }
  parser.finish(events);
  // Whatever the model writes, clients get valid UTF-8 text and, for a call not flagged as
  // malformed, arguments that are a JSON object.
  for (const auto& e : events) {
    fuzz_check(utf8::is_valid(e.text) && utf8::is_valid(e.name), "an event is not valid UTF-8");
  }
  const ParsedTurn whole = parse_all(tok, ids, start);
  fuzz_check(utf8::is_valid(whole.reasoning) && utf8::is_valid(whole.content),
             "parsed text is not valid UTF-8");
  for (const auto& c : whole.tool_calls) {
    if (c.malformed) continue;
    const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
    fuzz_check(args.is_object(), "a well-formed tool call's arguments are not a JSON object");
  }
}

}  // namespace deltafin::fuzz
