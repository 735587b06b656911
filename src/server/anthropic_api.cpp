// Anthropic Messages <-> the engine's chat request (see anthropic_api.h).
#include "server/anthropic_api.h"

#include <ctime>

#include "core/log.h"
#include "server/translate.h"

namespace deltafin::server {

// Named, not anonymous: the sanitizer builds compile src/server as one unity file, where
// another file's helpers of the same names would clash. Inside `translate`, so the shared field
// readers (translate.h) are found without naming each.
namespace translate::anthropic {

using json = nlohmann::ordered_json;

// A content array's text blocks as Chat Completions text parts (or the string itself).
// `allowed` names the block types that may appear besides text (the caller handles them).
json text_parts(const json& content, const std::string& path) {
  if (content.is_string()) return content;
  array_of(content, path);
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    const json& b = object_of(content[i], p);
    const std::string type = string_of(need(b, "type", p), p + ".type");
    if (type != "text") {
      bad_request(p + ".type", "{}.type: \"{}\" blocks are not supported here (only text)", p,
                  type);
    }
    only_fields(b, {"type", "text", "cache_control", "citations"}, p);
    parts.push_back({{"type", "text"}, {"text", string_of(need(b, "text", p), p + ".text")}});
  }
  return parts;
}

// An `image` block -> the internal image_url part (image_parts.h); `document` blocks and file
// sources are refused with what to send instead.
json image_part(const json& b, const std::string& p, ImageGate& gate) {
  only_fields(b, {"type", "source", "cache_control"}, p);
  const std::string sp = p + ".source";
  const json& src = object_of(need(b, "source", p), sp);
  const std::string type = string_of(need(src, "type", sp), sp + ".type");
  if (type == "base64") {
    only_fields(src, {"type", "media_type", "data"}, sp);
    const std::string mime = string_of(need(src, "media_type", sp), sp + ".media_type");
    const std::string data = string_of(need(src, "data", sp), sp + ".data");
    return ImageGate::part(gate.from_base64(mime, data, sp, sp + ".media_type"), sp);
  }
  if (type == "url") {
    only_fields(src, {"type", "url"}, sp);
    return ImageGate::part(gate.from_url(string_of(need(src, "url", sp), sp + ".url"), sp), sp);
  }
  if (type == "file") {
    bad_request(sp + ".type",
                "{}.type: \"file\" sources need the Files API, which this server does not have; "
                "send the image as a base64 source",
                sp);
  }
  bad_request(sp + ".type", "{}.type: \"{}\" is not supported (base64, or url)", sp, type);
}

[[noreturn]] void refuse_document(const std::string& bp) {
  bad_request(bp + ".type",
              "{}.type: \"document\" blocks (PDF and text documents) are not supported: send "
              "the text as a text block, or pages as image blocks",
              bp);
}

json convert_tools(const json& tools, const json* choice, json& chat) {
  json out = json::array();
  array_of(tools, "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    const json& t = object_of(tools[i], p);
    if (const json* type = field(t, "type"); type != nullptr && *type != "custom") {
      bad_request(p + ".type",
                  "{}.type: {} is one of Anthropic's own tools; this server takes custom tools "
                  "(name, description, input_schema)",
                  p, type->dump());
    }
    only_fields(t,
                {"type", "name", "description", "input_schema", "cache_control", "defer_loading",
                 "strict", "input_examples", "eager_input_streaming"},
                p);
    const std::string name = string_of(need(t, "name", p), p + ".name");
    // A deferred tool is not shown to the model until the client loads it (as in the API).
    if (bool_field(t, "defer_loading", p).value_or(false)) continue;
    json fn;
    fn["name"] = name;
    if (const json* d = field(t, "description"))
      fn["description"] = string_of(*d, p + ".description");
    fn["parameters"] = object_of(need(t, "input_schema", p), p + ".input_schema");
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  if (choice == nullptr) return out;
  const json& c = object_of(*choice, "tool_choice");
  only_fields(c, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
  bool_field(c, "disable_parallel_tool_use", "tool_choice");
  const std::string type = string_of(need(c, "type", "tool_choice"), "tool_choice.type");
  if (type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (type == "none") {
    chat["tool_choice"] = "none";
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    force_tool(string_of(need(c, "name", "tool_choice"), "tool_choice.name"), out, chat,
               "tool_choice.name");
  } else {
    bad_request("tool_choice.type",
                "tool_choice.type: \"{}\" is not supported (auto, any, tool or none)", type);
  }
  return out;
}

// A tool_result's content: its text (joined; "Error: " first when is_error), or, when it holds
// image blocks (a screenshot a tool took), text and image parts in order.
json tool_result_content(const json& b, const std::string& bp, ImageGate& gate) {
  const bool is_error = bool_field(b, "is_error", bp).value_or(false);
  const json* c = field(b, "content");
  std::string text = is_error ? "Error: " : "";
  if (c == nullptr) return text;
  if (c->is_string()) return text + c->get<std::string>();
  const std::string cp = bp + ".content";
  array_of(*c, cp);
  json parts = json::array();
  bool images = false;
  for (size_t k = 0; k < c->size(); ++k) {
    const std::string p = fmt::format("{}[{}]", cp, k);
    const json& blk = object_of((*c)[k], p);
    const std::string type = string_of(need(blk, "type", p), p + ".type");
    if (type == "image") {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
      text.clear();
      parts.push_back(image_part(blk, p, gate));
      images = true;
    } else if (type == "document") {
      refuse_document(p);
    } else if (type == "text") {
      only_fields(blk, {"type", "text", "cache_control", "citations"}, p);
      text += string_of(need(blk, "text", p), p + ".text");
    } else {
      bad_request(p + ".type", "{}.type: \"{}\" blocks are not supported here (text, image)", p,
                  type);
    }
  }
  if (!images) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// One Messages message -> Chat Completions messages (a user turn with tool results becomes tool
// messages, then a user message for its text).
void convert_message(const json& m, size_t i, const json* previous, json& out, ImageGate& gate) {
  const std::string p = fmt::format("messages[{}]", i);
  object_of(m, p);
  only_fields(m, {"role", "content"}, p);
  const std::string role = string_of(need(m, "role", p), p + ".role");
  const json& content = need(m, "content", p);
  const std::string cp = p + ".content";
  if (role == "system") {  // mid-conversation system text (Claude Code sends it)
    out.push_back({{"role", "system"}, {"content", text_parts(content, cp)}});
    return;
  }
  if (role != "user" && role != "assistant")
    bad_request(p + ".role", "{}.role: \"{}\" is not supported (user or assistant)", p, role);
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  array_of(content, cp);
  if (role == "assistant") {
    std::string text, reasoning;
    json calls = json::array();
    for (size_t k = 0; k < content.size(); ++k) {
      const std::string bp = fmt::format("{}[{}]", cp, k);
      const json& b = object_of(content[k], bp);
      const std::string type = string_of(need(b, "type", bp), bp + ".type");
      if (type == "text") {
        only_fields(b, {"type", "text", "cache_control", "citations"}, bp);
        text += string_of(need(b, "text", bp), bp + ".text");
      } else if (type == "thinking") {
        only_fields(b, {"type", "thinking", "signature", "cache_control"}, bp);
        reasoning += string_of(need(b, "thinking", bp), bp + ".thinking");
      } else if (type == "redacted_thinking") {
        only_fields(b, {"type", "data", "cache_control"}, bp);  // nothing K3 can read
      } else if (type == "tool_use") {
        only_fields(b, {"type", "id", "name", "input", "cache_control", "caller"}, bp);
        calls.push_back({{"id", string_of(need(b, "id", bp), bp + ".id")},
                         {"type", "function"},
                         {"function",
                          {{"name", string_of(need(b, "name", bp), bp + ".name")},
                           {"arguments", object_of(need(b, "input", bp), bp + ".input").dump()}}}});
      } else {
        bad_request(bp + ".type",
                    "{}.type: \"{}\" is not supported in assistant turns (text, thinking, "
                    "redacted_thinking, tool_use)",
                    bp, type);
      }
    }
    json msg = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(msg);
    return;
  }
  // A user turn: tool results in order, text between them as user messages.
  json parts = json::array();
  auto flush = [&] {
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", parts}});
    parts = json::array();
  };
  for (size_t k = 0; k < content.size(); ++k) {
    const std::string bp = fmt::format("{}[{}]", cp, k);
    const json& b = object_of(content[k], bp);
    const std::string type = string_of(need(b, "type", bp), bp + ".type");
    if (type == "text") {
      parts.push_back(text_parts(json::array({b}), cp)[0]);
    } else if (type == "image") {
      parts.push_back(image_part(b, bp, gate));
    } else if (type == "document") {
      refuse_document(bp);
    } else if (type == "tool_result") {
      only_fields(b, {"type", "tool_use_id", "content", "is_error", "cache_control"}, bp);
      const std::string id = string_of(need(b, "tool_use_id", bp), bp + ".tool_use_id");
      bool found = false;
      if (previous != nullptr && (*previous)["role"] == "assistant" &&
          previous->contains("tool_calls")) {
        for (const auto& c : (*previous)["tool_calls"]) found = found || c["id"] == id;
      }
      if (!found) {
        bad_request(bp + ".tool_use_id",
                    "{}.tool_use_id: no tool_use block with id \"{}\" in the previous assistant "
                    "message",
                    bp, id);
      }
      flush();
      out.push_back(
          {{"role", "tool"}, {"tool_call_id", id}, {"content", tool_result_content(b, bp, gate)}});
    } else {
      bad_request(bp + ".type",
                  "{}.type: \"{}\" blocks are not supported in user turns (text, image, "
                  "tool_result)",
                  bp, type);
    }
  }
  flush();
}

// thinking + output_config -> the chat body's thinking and reasoning_effort (docs/SERVER.md).
void convert_thinking(const json& body, json& chat, bool& omit_thinking) {
  std::optional<std::string> effort;
  if (const json* oc = field(body, "output_config")) {
    object_of(*oc, "output_config");
    only_fields(*oc, {"effort", "format"}, "output_config");
    if (const json* e = field(*oc, "effort"))
      effort = k3_effort(string_of(*e, "output_config.effort"), "output_config.effort");
    if (const json* f = field(*oc, "format")) {
      object_of(*f, "output_config.format");
      only_fields(*f, {"type", "schema"}, "output_config.format");
      if (string_of(need(*f, "type", "output_config.format"), "output_config.format.type") !=
          "json_schema") {
        bad_request("output_config.format.type",
                    "output_config.format.type: only \"json_schema\" is supported");
      }
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema",
                                  {{"name", "output"},
                                   {"schema", object_of(need(*f, "schema", "output_config.format"),
                                                        "output_config.format.schema")}}}};
    }
  }
  bool thinking = false;  // off unless asked for, as in the Messages API
  if (const json* t = field(body, "thinking")) {
    object_of(*t, "thinking");
    only_fields(*t, {"type", "budget_tokens", "display"}, "thinking");
    const std::string type = string_of(need(*t, "type", "thinking"), "thinking.type");
    if (type == "enabled") {
      const json& b = need(*t, "budget_tokens", "thinking");
      if (!b.is_number_integer() || b.get<int64_t>() < 1024) {
        bad_request("thinking.budget_tokens",
                    "thinking.budget_tokens: expected an integer of at least 1024, got {}",
                    b.dump());
      }
      // K3 thinks at an effort level, not to a budget: the budget picks the level.
      const int64_t n = b.get<int64_t>();
      if (!effort) effort = n < 4096 ? "low" : n < 16384 ? "high" : "max";
      thinking = true;
    } else if (type == "adaptive") {
      thinking = true;
    } else if (type != "disabled") {
      bad_request("thinking.type",
                  "thinking.type: \"{}\" is not supported (enabled, adaptive or disabled)", type);
    }
    if (const json* d = field(*t, "display")) {
      const std::string v = string_of(*d, "thinking.display");
      if (v != "summarized" && v != "omitted")
        bad_request("thinking.display",
                    "thinking.display: \"{}\" is not supported (summarized or omitted)", v);
      omit_thinking = v == "omitted";
    }
  }
  chat["thinking"] = thinking;
  if (thinking && effort) chat["reasoning_effort"] = *effort;
}

json convert(const json& body, bool count_only, bool& omit_thinking, bool& single_tool,
             const ImagePolicy& images) {
  only_fields(body,
              {"model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
               "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier",
               "context_management", "output_config"},
              "");
  json chat;
  if (const json* m = field(body, "model"))
    chat["model"] = *m;
  else if (!count_only)
    bad_request("model", "model: missing (required)");
  if (!count_only) {
    chat["max_tokens"] = need(body, "max_tokens", "");
    if (const json* s = field(body, "stream")) chat["stream"] = *s;
  } else {
    chat["max_tokens"] = 1;
  }
  if (const json* t = field(body, "temperature")) {
    if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 1)
      bad_request("temperature", "temperature: expected a number from 0 to 1, got {}", t->dump());
    chat["temperature"] = *t;
  }
  if (const json* t = field(body, "top_p")) chat["top_p"] = *t;
  if (const json* t = field(body, "top_k")) chat["top_k"] = *t;
  if (const json* s = field(body, "stop_sequences")) {
    array_of(*s, "stop_sequences");
    for (size_t i = 0; i < s->size(); ++i) string_of((*s)[i], fmt::format("stop_sequences[{}]", i));
    if (!s->empty()) chat["stop"] = *s;
  }
  if (const json* m = field(body, "metadata")) {
    object_of(*m, "metadata");
    only_fields(*m, {"user_id"}, "metadata");
  }
  if (const json* st = field(body, "service_tier");
      st != nullptr && *st != "auto" && *st != "standard_only") {
    bad_request("service_tier", "service_tier: {} is not supported (auto or standard_only)",
                st->dump());
  }
  if (const json* cm = field(body, "context_management")) {
    // Keeping all past thinking (what Claude Code asks for) is what the K3 renderer does; any
    // other edit (clearing thinking or tool results) would change the prompt, which this server
    // does not do.
    object_of(*cm, "context_management");
    only_fields(*cm, {"edits"}, "context_management");
    if (const json* edits = field(*cm, "edits")) {
      array_of(*edits, "context_management.edits");
      for (size_t i = 0; i < edits->size(); ++i) {
        const std::string p = fmt::format("context_management.edits[{}]", i);
        const json& edit = object_of((*edits)[i], p);
        const std::string type = string_of(need(edit, "type", p), p + ".type");
        if (type.rfind("clear_thinking_", 0) != 0 || edit.value("keep", json()) != "all") {
          bad_request(p,
                      "{}: only clear_thinking with keep \"all\" is supported (the prompt "
                      "keeps every past turn as K3's renderer writes it), got {}",
                      p, edit.dump());
        }
      }
    }
  }
  convert_thinking(body, chat, omit_thinking);

  json messages = json::array();
  if (const json* s = field(body, "system"))
    messages.push_back({{"role", "system"}, {"content", text_parts(*s, "system")}});
  const json& msgs = array_of(need(body, "messages", ""), "messages");
  if (msgs.empty()) bad_request("messages", "messages: at least one message is required");
  if (msgs.size() > kMaxMessages)
    bad_request("messages", "messages: at most {} messages, got {}", kMaxMessages, msgs.size());
  ImageGate gate(images);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json* prev = messages.empty() ? nullptr : &messages.back();
    convert_message(msgs[i], i, prev, messages, gate);
  }
  if (messages.back()["role"] == "assistant") {
    bad_request("messages",
                "messages: the last message is an assistant turn (prefilling the answer is not "
                "supported: K3's prompt always opens a new assistant turn)");
  }
  chat["messages"] = messages;
  if (const json* t = field(body, "tools")) {
    json tools = convert_tools(*t, field(body, "tool_choice"), chat);
    if (!tools.empty()) chat["tools"] = tools;
  } else if (field(body, "tool_choice") != nullptr) {
    convert_tools(json::array(), field(body, "tool_choice"), chat);
  }
  if (const json* tc = field(body, "tool_choice"))
    single_tool = tc->value("disable_parallel_tool_use", false);
  return chat;
}

// Anthropic's wire: content blocks opened and closed as K3's channels change.
class AnthropicWire final : public PartsWire {
 public:
  AnthropicWire(std::string model, int64_t prompt_tokens, bool omit_thinking, bool single_tool)
      : PartsWire(single_tool),
        id_(random_id("msg_")),
        model_(std::move(model)),
        prompt_tokens_(prompt_tokens),
        omit_thinking_(omit_thinking) {}

  std::string begin() override {
    json message = head();
    message["content"] = json::array();
    message["stop_reason"] = nullptr;
    message["stop_sequence"] = nullptr;
    message["usage"] = {{"input_tokens", prompt_tokens_},
                        {"cache_creation_input_tokens", 0},
                        {"cache_read_input_tokens", 0},
                        {"output_tokens", 0}};
    return event("message_start", {{"type", "message_start"}, {"message", message}});
  }

  std::string end(const Outcome& o) override {
    std::string out = close();
    json delta = {{"stop_reason", stop_reason(o)}, {"stop_sequence", stop_sequence(o)}};
    out += event("message_delta",
                 {{"type", "message_delta"}, {"delta", delta}, {"usage", usage(o.usage)}});
    out += event("message_stop", {{"type", "message_stop"}});
    return out;
  }

  std::string failure(const ApiError& e) override {
    return event("error", error_json(e, ErrorStyle::anthropic));
  }

  std::string keep_alive() override { return event("ping", {{"type", "ping"}}); }

  json response(const Outcome& o) override {
    json j = head();
    json content = json::array();
    for (const auto& p : parts()) content.push_back(block_json(p, true));
    j["content"] = content;
    j["stop_reason"] = stop_reason(o);
    j["stop_sequence"] = stop_sequence(o);
    j["usage"] = usage(o.usage);
    return j;
  }

 private:
  std::string opened(Part& p) override {
    if (p.kind == Kind::tool) p.id = random_id("toolu_");
    return event("content_block_start", {{"type", "content_block_start"},
                                         {"index", parts().size() - 1},
                                         {"content_block", block_json(p, false)}});
  }

  std::string appended(const Part& p, const std::string& text) override {
    json d;
    if (p.kind == Kind::thinking) {
      if (omit_thinking_) return "";
      d = {{"type", "thinking_delta"}, {"thinking", text}};
    } else if (p.kind == Kind::text) {
      d = {{"type", "text_delta"}, {"text", text}};
    } else {
      d = {{"type", "input_json_delta"}, {"partial_json", text}};
    }
    return event(
        "content_block_delta",
        {{"type", "content_block_delta"}, {"index", parts().size() - 1}, {"delta", std::move(d)}});
  }

  std::string closed(const Part&) override {
    return event("content_block_stop",
                 {{"type", "content_block_stop"}, {"index", parts().size() - 1}});
  }

  json head() const {
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}};
  }

  static std::string event(const char* name, const json& data) {
    return fmt::format("event: {}\ndata: {}\n\n", name, dump(data));
  }

  json block_json(const Part& p, bool whole) const {
    switch (p.kind) {
      case Kind::thinking:
        return {{"type", "thinking"},
                {"thinking", whole && !omit_thinking_ ? p.text : ""},
                {"signature", ""}};
      case Kind::tool:
        return {{"type", "tool_use"},
                {"id", p.id},
                {"name", p.name},
                {"input", whole ? arguments_object(p.text) : json::object()}};
      default:
        return {{"type", "text"}, {"text", whole ? p.text : ""}};
    }
  }

  std::string stop_reason(const Outcome& o) const {
    switch (o.stop) {
      case StopReason::kLength:
      case StopReason::kContext:
        return "max_tokens";
      case StopReason::kStopString:
        return "stop_sequence";
      default:
        return calls() > 0 ? "tool_use" : "end_turn";
    }
  }

  static json stop_sequence(const Outcome& o) {
    return o.stop == StopReason::kStopString ? json(o.stop_string) : json(nullptr);
  }

  static json usage(const Usage& u) {
    return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens},
            {"output_tokens", u.completion_tokens}};
  }

  std::string id_, model_;
  int64_t prompt_tokens_;
  bool omit_thinking_;
};

json anthropic_to_chat_impl(const json& body, bool count_only, const ImagePolicy& images) {
  bool omit = false, single = false;
  return convert(body, count_only, omit, single, images);
}

Translation anthropic_messages_impl(const json& body, const ServeLimits& limits,
                                    const Tokenizer& tok) {
  bool omit = false, single = false;
  const json chat = convert(body, false, omit, single, limits.images);
  ServeRequest r = to_engine(chat, limits, tok);
  const auto prompt = static_cast<int64_t>(r.prompt.size());
  auto wire = std::make_unique<AnthropicWire>(limits.model_id, prompt, omit, single);
  return {std::move(r), std::move(wire)};
}

json anthropic_count_tokens_impl(const json& body, const ServeLimits& limits,
                                 const Tokenizer& tok) {
  const ServeRequest r =
      to_engine_uncapped(anthropic_to_chat(body, true, limits.images), limits, tok);
  return {{"input_tokens", static_cast<int64_t>(r.prompt.size())}};
}

}  // namespace translate::anthropic

using json = nlohmann::ordered_json;

json anthropic_to_chat(const json& body, bool count_only, const ImagePolicy& images) {
  return translate::anthropic::anthropic_to_chat_impl(body, count_only, images);
}

Translation anthropic_messages(const json& body, const ServeLimits& limits, const Tokenizer& tok) {
  return translate::anthropic::anthropic_messages_impl(body, limits, tok);
}

json anthropic_count_tokens(const json& body, const ServeLimits& limits, const Tokenizer& tok) {
  return translate::anthropic::anthropic_count_tokens_impl(body, limits, tok);
}

}  // namespace deltafin::server
