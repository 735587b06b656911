// The K2-family chat formats (docs/FAMILY.md "Chat formats and tokenizers"): what the released
// Jinja templates write, reproduced from the parsed request, byte for byte against the goldens in
// tests/data/chat/k2-instruct and k2-thinking.
//
// A message is ROLE_TOKEN + role name (text) + <|im_middle|> + body + <|im_end|>; the role
// token is <|im_user|>, <|im_assistant|> or <|im_system|> (every other role). The formats differ
// in the default system prompt, in role names, and in what an assistant or tool body holds:
//  * k2-instruct (the first template): fixed role names, bodies are the content alone (tool
//    calls, tool-call ids and reasoning are not rendered), default system prompt "You are a
//    helpful assistant" before a first message that is not a system message;
//  * k2-thinking and k2.5: role name = the message's `name`, else its role; an assistant body is
//    <think>REASONING</think> + content + the tool-call section; REASONING is kept only in the
//    turns after the last assistant message without tool calls (the turns of the tool loop still
//    open) and emptied before it; a tool body is "## Return of ID\n" + content; default system
//    prompt "You are Kimi, an AI assistant created by Moonshot AI." when the first message is not
//    a system message (or there is none). k2.5's generation prompt opens <think> (or writes
//    <think></think> when thinking is off);
//  * kimi-linear (template not pinned; what docs/FAMILY.md reports): k2-thinking's structure
//    without think blocks and without a default system prompt.
// Where a template fails or writes Python's None, the engine renders sensibly instead, and says
// so in docs/FAMILY.md: null content is empty (k2-instruct's template raises), a null
// reasoning_content or tool_call_id is absent (k2-thinking's writes "None"), a call without an
// id gets `functions.NAME:INDEX` (INDEX counting the conversation's calls from 0), and null
// arguments are `{}`. K3-only inputs that have no K2 form (a system message declaring tools) are
// refused by path; `reasoning_effort`, `tool_choice` and `response_format` are not rendered (no K2
// template does), the turn constraint enforces the last two.
//
// The prompt marks sit where K3's do: system_end after the tool declaration, the default system
// prompt and the leading system messages; last_message before the last message; messages_end
// after it, before the generation prompt.
#include <map>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/json_text.h"

namespace deltafin {

namespace {

constexpr const char* kImSystem = "<|im_system|>";
constexpr const char* kImUser = "<|im_user|>";
constexpr const char* kImAssistant = "<|im_assistant|>";
constexpr const char* kImMiddle = "<|im_middle|>";
constexpr const char* kImEnd = "<|im_end|>";
constexpr const char* kThink = "<think>";
constexpr const char* kThinkEnd = "</think>";
constexpr const char* kSectionBegin = "<|tool_calls_section_begin|>";
constexpr const char* kSectionEnd = "<|tool_calls_section_end|>";
constexpr const char* kCallBegin = "<|tool_call_begin|>";
constexpr const char* kArgBegin = "<|tool_call_argument_begin|>";
constexpr const char* kCallEnd = "<|tool_call_end|>";

// Special ids by name (looked up when first used, so a format that never writes <think> works
// with a tokenizer that has none) and text runs between them.
class K2Builder {
 public:
  K2Builder(const Tokenizer* tok, ChatFormat format) : tok_(tok), format_(format) {}

  void special(const char* name) {
    flush();
    out_.text += name;
    if (tok_ != nullptr) out_.ids.push_back(id_of(name));
  }
  void text(std::string_view s) {
    out_.text += s;
    pending_ += s;
  }
  int64_t mark() {
    flush();
    return static_cast<int64_t>(out_.ids.size());
  }
  RenderedPrompt finish() {
    flush();
    return std::move(out_);
  }
  RenderedPrompt& out() { return out_; }

 private:
  int32_t id_of(const char* name) {
    const auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const auto id = tok_->special_id(name);
    if (!id) {
      fail("tokenizer has no special token {}, which the {} chat format needs", name,
           chat_format_name(format_));
    }
    ids_.emplace(name, *id);
    return *id;
  }
  void flush() {
    if (tok_ != nullptr && !pending_.empty()) tok_->encode_ordinary_append(pending_, out_.ids);
    pending_.clear();
  }

  const Tokenizer* tok_;
  ChatFormat format_;
  std::map<std::string, int32_t, std::less<>> ids_;
  std::string pending_;
  RenderedPrompt out_;
};

const char* role_text(ChatMessage::Role r) {
  switch (r) {
    case ChatMessage::Role::system:
      return "system";
    case ChatMessage::Role::user:
      return "user";
    case ChatMessage::Role::assistant:
      return "assistant";
    case ChatMessage::Role::tool:
      return "tool";
  }
  return "system";
}

const char* role_token(ChatMessage::Role r) {
  switch (r) {
    case ChatMessage::Role::user:
      return kImUser;
    case ChatMessage::Role::assistant:
      return kImAssistant;
    case ChatMessage::Role::system:
    case ChatMessage::Role::tool:
      return kImSystem;
  }
  return kImSystem;
}

const char* default_system_prompt(ChatFormat f) {
  switch (f) {
    case ChatFormat::k2_instruct:
      return "You are a helpful assistant";
    case ChatFormat::k2_thinking:
    case ChatFormat::k2_5:
      return "You are Kimi, an AI assistant created by Moonshot AI.";
    case ChatFormat::kimi_linear:
    case ChatFormat::k3:
      return nullptr;
  }
  return nullptr;
}

// The arguments as the templates write them: a string verbatim, an object as tojson.
std::string arguments_text(const ChatToolCall& call) {
  if (call.arguments_text) return *call.arguments_text;
  if (call.args_kind == ChatToolCall::Args::json_block) return call.json_block;
  if (call.args_kind == ChatToolCall::Args::object)
    return python_json(call.arguments, JsonStyle::python_default);
  return "{}";
}

class K2Renderer {
 public:
  K2Renderer(const ChatRequest& req, const Tokenizer* tok, ChatFormat f)
      : req_(req), f_(f), b_(tok, f) {}

  RenderedPrompt render(bool with_tokenizer) {
    const auto& msgs = req_.messages;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (msgs[i].tools) {
        fail_arg(
            "messages[{}].tools: the {} chat format has no tool declaration inside a system "
            "message (that is K3's); declare the tools in the request's `tools`",
            i, chat_format_name(f_));
      }
    }
    if (!req_.tools.empty()) {
      header(kImSystem, "tool_declare");
      b_.text(python_json(req_.tools, JsonStyle::python_default));
      b_.special(kImEnd);
    }
    if (const char* def = default_system_prompt(f_)) {
      const bool first_not_system = !msgs.empty() && msgs.front().role != ChatMessage::Role::system;
      // The first K2-Instruct template inserts it in its message loop, so not without messages.
      if (first_not_system || (msgs.empty() && f_ != ChatFormat::k2_instruct)) {
        header(kImSystem, "system");
        b_.text(def);
        b_.special(kImEnd);
      }
    }
    int64_t system_end = b_.mark();
    int64_t last_message = 0;
    // The thinking formats keep reasoning only after the last assistant turn without tool calls.
    std::ptrdiff_t last_answer = -1;
    for (std::size_t i = msgs.size(); i-- > 0;) {
      if (msgs[i].role == ChatMessage::Role::assistant && msgs[i].tool_calls.empty()) {
        last_answer = static_cast<std::ptrdiff_t>(i);
        break;
      }
    }
    bool leading = true;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (i + 1 == msgs.size()) last_message = b_.mark();
      message(msgs[i], static_cast<std::ptrdiff_t>(i) > last_answer);
      if (leading && msgs[i].role == ChatMessage::Role::system)
        system_end = b_.mark();
      else
        leading = false;
    }
    const int64_t messages_end = b_.mark();
    if (req_.add_generation_prompt) {
      header(kImAssistant, "assistant");
      if (f_ == ChatFormat::k2_5) {
        b_.special(kThink);
        if (!req_.thinking) b_.special(kThinkEnd);
      } else if (f_ == ChatFormat::k2_thinking && !req_.thinking) {
        b_.special(kThink);
        b_.special(kThinkEnd);
      }
    }
    if (with_tokenizer) {
      b_.out().system_end = system_end;
      b_.out().messages_end = messages_end;
      b_.out().last_message = last_message;
    }
    return b_.finish();
  }

 private:
  void header(const char* token, std::string_view name) {
    b_.special(token);
    b_.text(name);
    b_.special(kImMiddle);
  }

  void message(const ChatMessage& m, bool keeps_reasoning) {
    if (f_ == ChatFormat::k2_instruct) {
      header(role_token(m.role), role_text(m.role));
      b_.text(m.content);
      b_.special(kImEnd);
      return;
    }
    const std::string& named =
        m.role == ChatMessage::Role::tool ? m.tool_name.value_or("") : m.name;
    header(role_token(m.role), named.empty() ? role_text(m.role) : named);
    switch (m.role) {
      case ChatMessage::Role::assistant:
        if (format_thinks(f_)) {
          b_.special(kThink);
          if (keeps_reasoning && m.reasoning_content) b_.text(*m.reasoning_content);
          b_.special(kThinkEnd);
        }
        b_.text(m.content);
        if (!m.tool_calls.empty()) tool_calls(m.tool_calls);
        break;
      case ChatMessage::Role::tool:
        b_.text("## Return of ");
        b_.text(m.tool_call_id.value_or(""));
        b_.text("\n");
        b_.text(m.content);
        break;
      case ChatMessage::Role::system:
      case ChatMessage::Role::user:
        b_.text(m.content);
        break;
    }
    b_.special(kImEnd);
  }

  void tool_calls(const std::vector<ChatToolCall>& calls) {
    b_.special(kSectionBegin);
    for (const ChatToolCall& call : calls) {
      b_.special(kCallBegin);
      if (call.id) {
        b_.text(*call.id);
      } else {
        b_.text("functions.");
        b_.text(call.name);
        b_.text(":");  // piecewise: g++ 12 warns falsely (-Wrestrict) on ":" + std::string
        b_.text(std::to_string(calls_seen_));
      }
      b_.special(kArgBegin);
      b_.text(arguments_text(call));
      b_.special(kCallEnd);
      ++calls_seen_;
    }
    b_.special(kSectionEnd);
  }

  const ChatRequest& req_;
  ChatFormat f_;
  K2Builder b_;
  int64_t calls_seen_ = 0;  // tool calls so far in the conversation (ids made for calls without)
};

}  // namespace

RenderedPrompt render_k2(const ChatRequest& request, const Tokenizer* tokenizer,
                         ChatFormat format) {
  for (const ChatMessage& m : request.messages) {
    if (!m.images.empty()) {
      fail_arg("{}: image parts need K3's chat format ({} takes text only)", m.images[0].name,
               chat_format_name(format));
    }
  }
  if (!is_k2_family(format))
    fail("render_k2: {} is not a K2-family format", chat_format_name(format));
  return K2Renderer(request, tokenizer, format).render(tokenizer != nullptr);
}

}  // namespace deltafin
