// The chat session (see chat_session.h). Cancelled answers are kept with their exact ids, and a
// saved conversation carries its ids, so neither forces a re-tokenisation of generated text.
#include "generate/chat_session.h"

#include <algorithm>

#include "core/error.h"

namespace deltafin {

ChatSession::ChatSession(Model& model, const Tokenizer& tokenizer)
    : model_(model), tok_(tokenizer), state_(model.new_state()) {}

ChatRequest ChatSession::request(bool generation_prompt) const {
  ChatRequest r;
  if (!system_.empty()) r.messages.push_back({ChatMessage::Role::system, "", system_});
  r.messages.insert(r.messages.end(), messages_.begin(), messages_.end());
  r.thinking = thinking_;
  r.reasoning_effort = effort_;
  r.add_generation_prompt = generation_prompt;
  return r;
}

ChatTurn ChatSession::begin_user_turn(const std::string& text, std::vector<ChatImage> images) {
  ChatTurn t;
  t.start = thinking_ ? Channel::think : Channel::response;
  std::vector<int32_t> before;
  if (history_valid_) before = render(request(false), tok_, measure_).ids;
  ChatMessage user{ChatMessage::Role::user, "", ""};
  place_images(text, std::move(images), user);
  messages_.push_back(std::move(user));
  RenderedPrompt rendered;
  try {
    rendered = render(request(true), tok_, measure_);
  } catch (...) {
    messages_.pop_back();  // a refused image leaves the conversation as it was
    throw;
  }
  const std::vector<int32_t>& full = rendered.ids;
  if (history_valid_ && before.size() <= full.size() &&
      std::equal(before.begin(), before.end(), full.begin())) {
    // Append the new turn to what the model actually saw.
    std::vector<int32_t> tail(full.begin() + static_cast<ptrdiff_t>(before.size()), full.end());
    t.input = to_feed_;
    t.input.insert(t.input.end(), tail.begin(), tail.end());
    t.reused = state_.position();
    t.full_prefill = t.reused == 0;  // a loaded conversation: its saved ids, then the turn
    // The new turn's images, moved to their places in history_ (the earlier ones are kept).
    const auto shift = static_cast<int64_t>(history_.size()) - static_cast<int64_t>(before.size());
    for (PromptImage img : rendered.images) {
      if (img.segment_begin < static_cast<int64_t>(before.size())) continue;
      img.segment_begin += shift;
      img.pad_begin += shift;
      img.segment_end += shift;
      images_.push_back(std::move(img));
    }
    history_.insert(history_.end(), tail.begin(), tail.end());
  } else {
    state_.reset();
    history_ = full;
    images_ = rendered.images;
    t.input = full;
    t.full_prefill = true;
  }
  t.images = images_;
  to_feed_.clear();
  history_valid_ = false;  // until the generation's result is recorded
  // The marks of the rendering, where they fall in this turn's new ids.
  const auto shift = static_cast<int64_t>(history_.size()) - static_cast<int64_t>(full.size());
  const int64_t fresh =
      static_cast<int64_t>(history_.size()) - static_cast<int64_t>(t.input.size());
  auto place = [&](int64_t mark) { return mark + shift > fresh ? mark + shift : 0; };
  t.system_end = place(rendered.system_end);
  t.messages_end = place(rendered.messages_end);
  turn_end_ = static_cast<int64_t>(history_.size());
  last_turn_ = t;
  last_turn_.input.clear();
  return t;
}

ChatTurn ChatSession::begin_retry() {
  if (messages_.empty() || messages_.back().role != ChatMessage::Role::assistant ||
      turn_end_ == 0 || turn_end_ > static_cast<int64_t>(history_.size()))
    fail_arg("there is no answer to regenerate (ask something first)");
  messages_.pop_back();
  history_.resize(static_cast<size_t>(turn_end_));
  to_feed_.clear();
  history_valid_ = false;
  state_.reset();
  ChatTurn t = last_turn_;
  t.images = images_;
  t.input = history_;
  t.reused = 0;
  t.full_prefill = true;
  return t;
}

std::vector<int32_t> ChatSession::closing_ids(const Generation& g) const {
  // Close what the generation left open, exactly as the renderer writes a recorded answer.
  std::string text = tok_.decode(g.completion_ids());
  auto has = [&](const char* s) { return text.find(s) != std::string::npos; };
  std::string close;
  if (has("<|end_of_msg|>")) return {};
  if (has("<|open|>tools")) return {};  // cannot be closed faithfully: caller falls back
  if (thinking_ && !has("<|close|>think<|sep|>")) close += "<|close|>think<|sep|>";
  if (!has("<|open|>response<|sep|>") && thinking_) close += "<|open|>response<|sep|>";
  if (!has("<|close|>response<|sep|>")) close += "<|close|>response<|sep|>";
  if (!has("<|close|>message<|sep|>")) close += "<|close|>message<|sep|>";
  close += "<|end_of_msg|>";
  return tok_.encode_with_special(close);
}

void ChatSession::end_turn(const Generation& g) {
  ChatMessage m;
  m.role = ChatMessage::Role::assistant;
  m.content = g.content();
  if (thinking_) m.reasoning = g.reasoning();
  messages_.push_back(m);
  const auto ids = g.completion_ids();
  const std::string text = tok_.decode(ids);
  const bool ended = text.find("<|end_of_msg|>") != std::string::npos;
  // A cancelled answer (Ctrl-C) is kept like any other: the state holds exactly its ids, and
  // closing it as the renderer closes the recorded message keeps the next turn incremental.
  if (g.stop_reason() == StopReason::kStopString ||
      (!ended && text.find("<|open|>tools") != std::string::npos) || !g.tool_calls().empty()) {
    // The kept state no longer matches a rendering of the recorded message.
    history_valid_ = false;
    return;
  }
  history_.insert(history_.end(), ids.begin(), ids.end());
  to_feed_.clear();
  if (auto last = g.unconsumed_token()) to_feed_.push_back(*last);
  auto close = closing_ids(g);
  history_.insert(history_.end(), close.begin(), close.end());
  to_feed_.insert(to_feed_.end(), close.begin(), close.end());
  history_valid_ = true;
}

void ChatSession::reset() {
  messages_.clear();
  history_.clear();
  images_.clear();
  history_valid_ = false;
  to_feed_.clear();
  state_.reset();
}

void ChatSession::set_system(const std::string& text) {
  system_ = text;
  history_valid_ = false;
}

void ChatSession::set_effort(const std::string& effort) {
  if (effort != "low" && effort != "high" && effort != "max")
    fail_arg("effort {}: expected low, high or max", effort);
  effort_ = effort;
  history_valid_ = false;
}

void ChatSession::set_thinking(bool on) {
  thinking_ = on;
  history_valid_ = false;
}

nlohmann::ordered_json ChatSession::to_json() const {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  if (!system_.empty()) msgs.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : messages_) {
    nlohmann::ordered_json j;
    j["role"] = m.role == ChatMessage::Role::user        ? "user"
                : m.role == ChatMessage::Role::assistant ? "assistant"
                                                         : "system";
    j["content"] = content_json(m);
    if (m.reasoning) j["reasoning_content"] = *m.reasoning;
    msgs.push_back(j);
  }
  nlohmann::ordered_json j = {
      {"messages", msgs}, {"thinking", thinking_}, {"reasoning_effort", effort_}};
  // The ids the model saw: generated special tokens are ids, which a re-rendering of the text
  // would encode as ordinary text; saving them makes /save + /load exact.
  // (Not with images: their places in the ids are not saved, so a loaded conversation with
  // images is rendered again.)
  if (history_valid_ && images_.empty()) j["token_ids"] = history_;
  return j;
}

void ChatSession::load_json(const nlohmann::ordered_json& j) {
  // Everything is checked before the session changes, so a bad file leaves it as it was.
  ChatRequest r = ChatRequest::from_json(j);
  ChatRequest loaded;  // system message first, as request() builds it
  std::string system;
  bool have_system = false;
  for (auto& m : r.messages) {
    if (m.role == ChatMessage::Role::system && loaded.messages.empty() && !m.content.empty()) {
      system = m.content;
      have_system = true;
      loaded.messages.push_back(m);
      continue;
    }
    if (m.role == ChatMessage::Role::tool ||
        (m.role == ChatMessage::Role::assistant && !m.tool_calls.empty())) {
      fail_arg(
          "the chat command keeps plain conversations; tool calls and results cannot be loaded");
    }
    loaded.messages.push_back(std::move(m));
  }
  loaded.thinking = r.thinking;
  loaded.reasoning_effort = r.reasoning_effort.value_or(effort_);
  loaded.add_generation_prompt = false;
  std::vector<int32_t> ids;
  const auto it = j.find("token_ids");
  const bool have_ids = it != j.end() && !it->is_null();
  if (have_ids) {
    if (!it->is_array()) fail_arg("token_ids: expected an array of token ids");
    ids.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& v = (*it)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok_.vocab_size())
        fail_arg("token_ids[{}]: {} is not a token id (expected 0 to {})", i, v.dump(),
                 tok_.vocab_size() - 1);
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }

  reset();
  system_ = std::move(system);
  messages_.assign(loaded.messages.begin() + (have_system ? 1 : 0), loaded.messages.end());
  thinking_ = loaded.thinking;
  effort_ = *loaded.reasoning_effort;
  if (have_ids) {
    history_ = std::move(ids);
    to_feed_ = history_;  // the state is empty: the next turn feeds all of them
    history_valid_ = true;
  }
}

}  // namespace deltafin
