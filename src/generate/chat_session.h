// A multi-turn conversation over one kept model State. Each turn costs only its new tokens: the
// session remembers the exact ids the model consumed (its own generated ids included, not a
// re-tokenisation of their text) and appends the rendered new turn to them. The new turn's ids
// are the difference between rendering the conversation with and without it, which is exact
// because the K3 renderer only appends per message (no tools, tool_choice or response_format
// blocks are used here). A generation that stopped before closing its turn is closed with the
// same structure the renderer writes for the recorded message. Anything that changes earlier
// text (system prompt, effort, thinking switch, loading a conversation) falls back to a full
// prefill, and the turn says so. Images stay in the conversation: each turn reports all of them
// at their places in the history, and only those in the new ids are encoded.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "generate/generation.h"
#include "model/model.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

struct ChatTurn {
  std::vector<int32_t> input;  // what to feed before generating
  int64_t reused = 0;          // conversation tokens already in the state
  bool full_prefill = false;
  Channel start = Channel::think;
  // Positions in history() (0 where not in this turn's new ids): after the leading system
  // messages and after the last message, before the generation prompt — where the prefix store
  // snapshots (prefix/reuse.h).
  int64_t system_end = 0, messages_end = 0;
  // Every image of the conversation, its spans at their places in history() (the sequence
  // encodes those past what the state holds; the prefix store keys them by their hashes).
  std::vector<PromptImage> images;
  // A restore from the prefix store replaced the state: the first `n` ids of the input are in it.
  void skip(int64_t n) {
    input.erase(input.begin(), input.begin() + n);
    reused += n;
  }
};

class ChatSession {
 public:
  ChatSession(Model& model, const Tokenizer& tokenizer);

  // `images` go in the user message before the text, or at its <|kimi_image_placeholder|>s; the
  // session's measurer (set_image_measurer) measures them, none: an image is refused.
  ChatTurn begin_user_turn(const std::string& text, std::vector<ChatImage> images = {});
  void set_image_measurer(ImageMeasurer measure) { measure_ = std::move(measure); }
  // Regenerates the last answer: it is dropped and the turn that asked for it starts again from
  // an empty state (the prefix store then restores what it kept of it). Throws InvalidArgument
  // when there is no answer to regenerate.
  ChatTurn begin_retry();
  // Records the assistant's answer from a finished generation of the turn begun last.
  void end_turn(const Generation& g);

  void reset();
  void set_system(const std::string& text);
  void set_effort(const std::string& effort);  // low, high or max
  void set_thinking(bool on);
  bool thinking() const { return thinking_; }
  const std::string& effort() const { return effort_; }

  // The conversation as OpenAI-style JSON: {"messages": [...], "thinking": b, "reasoning_effort":
  // e}.
  nlohmann::ordered_json to_json() const;
  // Loads a conversation saved by to_json (checked completely before the session changes). Its
  // "token_ids", when present, are what the next turn prefills: the model's own ids, special
  // tokens included, which a rendering of the messages' text would not reproduce. (To load
  // edited messages, drop "token_ids" and they are rendered.)
  void load_json(const nlohmann::ordered_json& j);

  State& state() { return state_; }
  // The conversation's ids as the model saw and wrote them (with a turn's input once begun).
  std::span<const int32_t> history() const { return history_; }
  // The ids the state has consumed (the conversation before the turn's input).
  std::span<const int32_t> consumed() const {
    return std::span<const int32_t>(history_).first(static_cast<size_t>(state_.position()));
  }
  int64_t history_tokens() const { return static_cast<int64_t>(history_.size()); }

 private:
  ChatRequest request(bool generation_prompt) const;
  std::vector<int32_t> closing_ids(const Generation& g) const;

  [[maybe_unused]] Model& model_;  // not read yet: silences clang -Wunused-private-field
  const Tokenizer& tok_;
  State state_;
  std::vector<ChatMessage> messages_;
  std::string system_, effort_ = "max";
  bool thinking_ = true;
  std::vector<int32_t> history_;  // ids of the conversation as the model saw / wrote them
  bool history_valid_ = false;    // state_ consumed history_ (minus a pending last token)
  // The tail of history_ the state has not consumed yet: the last sampled token and any
  // closing structure; fed at the start of the next turn.
  std::vector<int32_t> to_feed_;
  ImageMeasurer measure_;
  std::vector<PromptImage> images_;  // the images of history_, at their places in it
  // The last user turn: history_'s length at its end (generation prompt included) and its marks.
  int64_t turn_end_ = 0;
  ChatTurn last_turn_;
};

}  // namespace deltafin
