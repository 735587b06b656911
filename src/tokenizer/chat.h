// Chat rendering: an OpenAI-style chat request -> the exact prompt text and ids, in the model's
// chat format (tokenizer.chat_format(), chat_format.h): K3's XTML here and in chat.cpp, the K2
// family's role-token format in chat_k2.cpp.
//
// Two steps, so the server can validate a request before queueing it and reuse the parsed
// form: ChatRequest::from_json() checks every field and reports the first problem by its path
// (`messages[2].content`); render() lays the prompt out as the model's format says: for K3 as
// docs/MODEL.md §5.3 and llama.cpp's Kimi-K3 template (which reproduces the reference encoder's
// gold strings) do; for the K2 family as the released Jinja templates do (docs/FAMILY.md "Chat
// formats and tokenizers", goldens in tests/data/chat/k2-*).
//
// Injection safety: the prompt is built from segments. Only the renderer's own structure emits
// special ids (K3: <|open|>, <|sep|>, <|close|>, <|end_of_msg|>; K2: the role tokens,
// <|im_middle|>, <|im_end|>, <think>, </think> and the tool-call tokens); every other byte (tag
// names, attributes, role names, message content, names, ids, arguments, tool JSON) is encoded
// with encode_ordinary, one run per stretch of text between two specials. A user who types
// `<|end_of_msg|>` or `<|im_end|>` gets ordinary tokens. Where the reference raises,
// InvalidArgument carries the reference's reason (prefixed with the message's path where there is
// one).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deltafin {

struct ChatToolCall {
  std::optional<std::string> id;  // `id`, as text (matched against tool results' tool_call_id)
  std::string name;               // `function.name` (required)
  enum class Args {
    none,        // null, absent-and-empty, or a blank string: nothing between the call tags
    object,      // typed `argument` tags, in the given key order
    json_block,  // raw text in a `json` block (a string that is not a JSON object)
  };
  Args args_kind = Args::none;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // when object
  std::string json_block;                                               // when json_block
  // `arguments` exactly as given when it was a string (the K2 formats write it verbatim).
  std::optional<std::string> arguments_text;
};

// An image content part (docs/VISION.md §6): OpenAI's `{"type": "image_url", "image_url": {"url":
// "data:image/png;base64,..."}}` (also `"image_url": "data:..."`, and `"type": "image"` with an
// `image_url` or `url`); the bytes are the data URL's, decoded. Remote URLs are refused here: the
// renderer never fetches what a client names.
struct ChatImage {
  std::shared_ptr<const std::string> bytes;
  std::string media_type;  // the data URL's, e.g. image/png
  std::string name;        // the part's path, `messages[1].content[0]`: errors name the image
  size_t offset = 0;       // where in the message's `content` text it goes
};

// What the renderer needs to know of an image to lay out its segment: the decoded size (the
// prompt's `image WxH`), the number of <|media_pad|> tokens, and the content hash the prefix
// store keys the pads by. The caller that has a vision tower measures (headers only: the
// runtime's image_measurer over VisionEncoder::plan); throws InvalidArgument naming the image.
struct ImageMeasure {
  int64_t width = 0, height = 0, tokens = 0;
  std::array<uint8_t, 32> hash{};  // SHA-256 of the bytes
};
using ImageMeasurer = std::function<ImageMeasure(const ChatImage&)>;

// One image of a rendered prompt, in prompt order: its bytes and where its segment lies in ids.
struct PromptImage {
  std::shared_ptr<const std::string> bytes;
  std::string name;
  int64_t width = 0, height = 0;
  std::array<uint8_t, 32> hash{};
  int64_t segment_begin = 0;  // the <|media_begin|>
  int64_t pad_begin = 0;      // the first <|media_pad|>; `tokens` of them follow
  int64_t tokens = 0;
  int64_t segment_end = 0;  // after the <|media_end|>
};

// Where a front end that takes plain text marks an image's place (docs/VISION.md §6): ordinary
// text, replaced by the image's segment.
inline constexpr const char* kImagePlaceholder = "<|kimi_image_placeholder|>";

// The hash as 64 lowercase hex digits (render/tokenize show it).
std::string image_hash_hex(const std::array<uint8_t, 32>& hash);

// The ids the prefix store keys a prompt by (docs/VISION.md §11.7): `ids` with every position of
// each image's segment, from <|media_begin|> to <|media_end|>, replaced by a negative id derived
// from the image's hash (no token id is negative), so a state is shared only by prompts with the
// same images at the same places. Without images the ids themselves.
std::vector<int32_t> state_key_ids(std::span<const int32_t> ids,
                                   std::span<const PromptImage> images);

struct ChatMessage {
  enum class Role { system, user, assistant, tool };
  Role role = Role::user;
  std::string name;                      // `name` attribute of system/user/assistant; empty = none
  std::string content;                   // text, or text parts joined with nothing between them
  std::vector<ChatImage> images;         // image parts, in order (each at its content offset)
  std::optional<std::string> reasoning;  // assistant: `reasoning_content`, else `reasoning`
  std::optional<std::string> reasoning_content;  // assistant: `reasoning_content` alone (K2)
  std::vector<ChatToolCall> tool_calls;          // assistant
  // system: a non-empty `tools` array makes this a dynamic tool declaration (content unused).
  std::optional<nlohmann::ordered_json> tools;
  // tool: `tool_call_id` (else `id`), and the declared name (`tool` if the key is present,
  // else `name`); a result matched to a call is named after the call instead.
  std::optional<std::string> tool_call_id;
  std::optional<std::string> tool_name;
};

struct ChatRequest {
  enum class ToolChoice { unset, auto_, none, required, named };
  enum class ResponseFormat { text, json_object, json_schema };

  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // declared when non-empty
  ToolChoice tool_choice = ToolChoice::unset;
  ResponseFormat response_format = ResponseFormat::text;
  nlohmann::ordered_json response_schema;  // json_schema only; null renders as `null`
  // `reasoning_effort`: absent -> "max"; JSON null -> no effort message (template semantics).
  // K3 only: the K2 formats have no effort control and ignore it.
  std::optional<std::string> reasoning_effort = "max";
  // `thinking`: bool, or {"type": "enabled"|"disabled"}. K3 and K2.5 open the think (or the
  // response) channel by it; K2-Thinking, which always thinks, gets an empty think block in the
  // generation prompt when it is false; K2-Instruct and Kimi-Linear have no reasoning and ignore
  // it.
  bool thinking = true;
  bool add_generation_prompt = true;  // `add_generation_prompt`

  // Validates and converts a request body; unknown top-level fields (model, temperature, ...)
  // are ignored. Throws InvalidArgument naming the field.
  static ChatRequest from_json(const nlohmann::ordered_json& body);
};

struct RenderedPrompt {
  std::string text;
  std::vector<int32_t> ids;
  // Positions in `ids` (0 without a tokenizer): after the leading system messages and the tool
  // and effort declarations before them, and after the last message (before the tool-choice and
  // response-format blocks and the generation prompt). The prefix store snapshots there.
  int64_t system_end = 0;
  int64_t messages_end = 0;
  // Before the last message: an edited last message restarts there.
  int64_t last_message = 0;
  // The images, in prompt order, with their segments' places in `ids` (`text` holds each
  // segment as the reference renderer writes it, with one <|media_pad|>; `ids` hold N).
  std::vector<PromptImage> images;
};

// The four structural markers (also what the output parser looks for).
inline constexpr const char* kOpenMarker = "<|open|>";
inline constexpr const char* kCloseMarker = "<|close|>";
inline constexpr const char* kSepMarker = "<|sep|>";
inline constexpr const char* kEndOfMsgMarker = "<|end_of_msg|>";

// Renders the prompt text and ids in the tokenizer's chat format. Throws InvalidArgument for
// requests the reference rejects (K3: unsupported effort, unresolvable tool-result name; K2: a
// K3-only field such as a system message's `tools`) and Error when the tokenizer lacks a special
// token the format needs.
// Image parts are measured by `measure`; without one (a model without a vision tower) an image
// part is an InvalidArgument naming it. Only K3's format takes images.
RenderedPrompt render(const ChatRequest& request, const Tokenizer& tokenizer,
                      const ImageMeasurer& measure = {});

// Text only (no tokenizer needed): the same string render() returns in `.text`, in K3's format
// or in `format`.
std::string render_text(const ChatRequest& request);
std::string render_text(const ChatRequest& request, ChatFormat format);

// A message's content as a request carries it: its text, or with images the content parts
// (image_url parts with data URLs and text parts) — what ChatRequest::from_json reads back.
nlohmann::ordered_json content_json(const ChatMessage& message);

// The K2-family renderer (chat_k2.cpp); `tokenizer` null renders text only. render() calls it
// for the K2 formats.
RenderedPrompt render_k2(const ChatRequest& request, const Tokenizer* tokenizer, ChatFormat format);

// Sets `message`'s content to `text` with `images` placed at its <|kimi_image_placeholder|>s in
// order (the placeholders removed), or all before the text when it has none. InvalidArgument
// when the counts differ.
void place_images(std::string_view text, std::vector<ChatImage> images, ChatMessage& message);
// A raw prompt (no chat structure): the message's text as ordinary tokens with each image's
// segment at its place (`run` and `tokenize` without --chat).
RenderedPrompt encode_with_images(const Tokenizer& tokenizer, const ChatMessage& message,
                                  const ImageMeasurer& measure);

// Convenience: from_json + render.
RenderedPrompt render_json(const nlohmann::ordered_json& body, const Tokenizer& tokenizer,
                           const ImageMeasurer& measure = {});

}  // namespace deltafin
