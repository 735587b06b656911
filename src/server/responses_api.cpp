// OpenAI Responses <-> the engine's chat request (see responses_api.h).
#include "server/responses_api.h"

#include <ctime>

#include "core/log.h"
#include "server/translate.h"

namespace deltafin::server {

// Named, not anonymous: the sanitizer builds compile src/server as one unity file, where
// another file's helpers of the same names would clash. Inside `translate`, so the shared field
// readers (translate.h) are found without naming each.
namespace translate::responses {

using json = nlohmann::ordered_json;

// A message item's content: a string, or input_text / output_text parts (joined).
std::string item_text(const json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  array_of(content, path);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    const json& part = object_of(content[i], p);
    const std::string type = string_of(need(part, "type", p), p + ".type");
    if (type == "input_image") {
      bad_request(p + ".type", "{}.type: input_image parts are accepted in user messages only", p);
    }
    if (type != "input_text" && type != "output_text" && type != "text" && type != "summary_text" &&
        type != "reasoning_text") {
      bad_request(p + ".type", "{}.type: \"{}\" parts are not supported here (text only)", p, type);
    }
    only_fields(part, {"type", "text", "annotations", "logprobs"}, p);
    out += string_of(need(part, "text", p), p + ".text");
  }
  return out;
}

// A user message's content: its text (a string, or text parts joined), or, when it holds
// input_image parts, text and image_url parts in order (image_parts.h).
json user_content(const json& content, const std::string& path, ImageGate& gate) {
  if (content.is_string()) return content;
  array_of(content, path);
  json parts = json::array();
  std::string text;
  bool images = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    const json& part = object_of(content[i], p);
    const std::string type = string_of(need(part, "type", p), p + ".type");
    if (type == "input_image") {
      only_fields(part, {"type", "image_url", "file_id", "detail"}, p);
      if (field(part, "file_id") != nullptr) {
        bad_request(p + ".file_id",
                    "{}.file_id: file ids need the Files API, which this server does not have; "
                    "send the image as image_url (a data URL)",
                    p);
      }
      if (const json* d = field(part, "detail")) {
        if (!d->is_string() || (*d != "auto" && *d != "low" && *d != "high"))
          bad_request(p + ".detail", "{}.detail: expected \"auto\", \"low\" or \"high\"", p);
      }
      const std::string ip = p + ".image_url";
      const std::string url = string_of(need(part, "image_url", p), ip);
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
      text.clear();
      parts.push_back(ImageGate::part(gate.from_url(url, ip), ip));
      images = true;
    } else if (type == "input_file") {
      bad_request(p + ".type",
                  "{}.type: input_file parts are not supported (send text as input_text, or "
                  "pages as input_image)",
                  p);
    } else {
      text += item_text(json::array({part}), path);
    }
  }
  if (!images) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// The assistant turn being assembled from consecutive reasoning, message and function_call
// items (K3 writes one turn as think, response, tool calls).
struct Turn {
  std::string reasoning, content;
  json calls = json::array();
  bool open = false;
  void flush(json& messages) {
    if (!open) return;
    json m = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    if (!calls.empty()) m["tool_calls"] = calls;
    messages.push_back(m);
    *this = Turn{};
  }
};

void convert_input(const json& body, json& messages, ImageGate& gate) {
  const json& input = need(body, "input", "");
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  array_of(input, "input");
  if (input.size() > kMaxMessages)
    bad_request("input", "input: at most {} items, got {}", kMaxMessages, input.size());
  Turn turn;
  std::vector<std::string> call_ids;  // of the calls before the outputs that answer them
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = fmt::format("input[{}]", i);
    const json& item = object_of(input[i], p);
    const std::string type =
        field(item, "type") ? string_of(item["type"], p + ".type") : std::string("message");
    if (type == "message") {
      only_fields(item, {"type", "id", "role", "content", "status", "phase"}, p);
      const std::string role = string_of(need(item, "role", p), p + ".role");
      if (role == "user") {
        turn.flush(messages);
        messages.push_back(
            {{"role", "user"},
             {"content", user_content(need(item, "content", p), p + ".content", gate)}});
        continue;
      }
      const std::string text = item_text(need(item, "content", p), p + ".content");
      if (role == "assistant") {
        if (!turn.calls.empty()) turn.flush(messages);
        turn.open = true;
        turn.content += text;
        continue;
      }
      turn.flush(messages);
      if (role == "developer" || role == "system") {
        messages.push_back({{"role", "system"}, {"content", text}});
      } else {
        bad_request(p + ".role",
                    "{}.role: \"{}\" is not supported (user, assistant, system or developer)", p,
                    role);
      }
    } else if (type == "reasoning") {
      only_fields(item, {"type", "id", "summary", "content", "encrypted_content", "status"}, p);
      if (!turn.content.empty() || !turn.calls.empty()) turn.flush(messages);
      turn.open = true;
      // The reasoning text itself when the client kept it, else its summary.
      if (const json* c = field(item, "content")) {
        turn.reasoning += item_text(*c, p + ".content");
      } else if (const json* s = field(item, "summary")) {
        turn.reasoning += item_text(*s, p + ".summary");
      }
    } else if (type == "function_call") {
      only_fields(item, {"type", "id", "call_id", "name", "arguments", "status", "namespace"}, p);
      turn.open = true;
      const std::string id = string_of(need(item, "call_id", p), p + ".call_id");
      const std::string args = string_of(need(item, "arguments", p), p + ".arguments");
      turn.calls.push_back(
          {{"id", id},
           {"type", "function"},
           {"function",
            {{"name", string_of(need(item, "name", p), p + ".name")}, {"arguments", args}}}});
      call_ids.push_back(id);
    } else if (type == "function_call_output") {
      only_fields(item, {"type", "id", "call_id", "output", "status"}, p);
      turn.flush(messages);
      const std::string id = string_of(need(item, "call_id", p), p + ".call_id");
      if (std::find(call_ids.begin(), call_ids.end(), id) == call_ids.end()) {
        bad_request(p + ".call_id",
                    "{}.call_id: no function_call item with call_id \"{}\" before it", p, id);
      }
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", id},
                          {"content", item_text(need(item, "output", p), p + ".output")}});
    } else {
      bad_request(p + ".type",
                  "{}.type: \"{}\" items are not supported (message, reasoning, function_call, "
                  "function_call_output)",
                  p, type);
    }
  }
  turn.flush(messages);
}

// Function tools as Chat Completions tools; other kinds are left out (logged).
json convert_tools(const json& body, json& chat) {
  json out = json::array();
  std::vector<std::string> left_out;
  if (const json* tools = field(body, "tools")) {
    array_of(*tools, "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string p = fmt::format("tools[{}]", i);
      const json& t = object_of((*tools)[i], p);
      const std::string type = string_of(need(t, "type", p), p + ".type");
      if (type != "function") {
        left_out.push_back(type);
        continue;
      }
      only_fields(t, {"type", "name", "description", "parameters", "strict", "defer_loading"}, p);
      json fn;
      fn["name"] = string_of(need(t, "name", p), p + ".name");
      if (const json* d = field(t, "description"))
        fn["description"] = string_of(*d, p + ".description");
      if (const json* s = field(t, "parameters"))
        fn["parameters"] = object_of(*s, p + ".parameters");
      out.push_back({{"type", "function"}, {"function", fn}});
    }
  }
  if (!left_out.empty()) {
    log_info("[serve] /v1/responses: {} tool{} that are not functions left out of the prompt ({})",
             left_out.size(), left_out.size() == 1 ? "" : "s", fmt::join(left_out, ", "));
  }
  if (const json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v != "auto" && v != "none" && v != "required")
        bad_request("tool_choice", "tool_choice: \"{}\" is not supported (auto, none, required)",
                    v);
      chat["tool_choice"] = v;
    } else {
      object_of(*tc, "tool_choice");
      only_fields(*tc, {"type", "name"}, "tool_choice");
      if (string_of(need(*tc, "type", "tool_choice"), "tool_choice.type") != "function")
        bad_request("tool_choice.type", "tool_choice.type: only \"function\" is supported");
      force_tool(string_of(need(*tc, "name", "tool_choice"), "tool_choice.name"), out, chat,
                 "tool_choice.name");
    }
  }
  return out;
}

void convert_text_format(const json& body, json& chat) {
  const json* text = field(body, "text");
  if (text == nullptr) return;
  object_of(*text, "text");
  only_fields(*text, {"format", "verbosity"}, "text");
  if (const json* v = field(*text, "verbosity")) string_of(*v, "text.verbosity");
  const json* f = field(*text, "format");
  if (f == nullptr) return;
  object_of(*f, "text.format");
  only_fields(*f, {"type", "name", "schema", "strict", "description"}, "text.format");
  const std::string type = string_of(need(*f, "type", "text.format"), "text.format.type");
  if (type == "json_schema") {
    json js = {{"name", f->value("name", "output")}};
    js["schema"] = object_of(need(*f, "schema", "text.format"), "text.format.schema");
    if (const json* s = field(*f, "strict")) js["strict"] = *s;
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
  } else if (type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
  } else if (type != "text") {
    bad_request("text.format.type",
                "text.format.type: \"{}\" is not supported (text, json_object, json_schema)", type);
  }
}

json convert(const json& body, bool& single_tool, const ImagePolicy& images) {
  only_fields(body,
              {"model",
               "input",
               "instructions",
               "tools",
               "tool_choice",
               "parallel_tool_calls",
               "max_output_tokens",
               "temperature",
               "top_p",
               "reasoning",
               "text",
               "stream",
               "stream_options",
               "store",
               "include",
               "prompt_cache_key",
               "client_metadata",
               "metadata",
               "user",
               "safety_identifier",
               "service_tier",
               "truncation",
               "background",
               "previous_response_id"},
              "");
  if (field(body, "previous_response_id") != nullptr) {
    bad_request("previous_response_id",
                "previous_response_id: responses are not stored by this server (store: false); "
                "send the whole conversation in input");
  }
  if (auto s = bool_field(body, "store", ""); s && *s) {
    bad_request("store", "store: true is not supported (this server keeps no responses)");
  }
  if (auto b = bool_field(body, "background", ""); b && *b)
    bad_request("background", "background: true is not supported");
  if (const json* t = field(body, "truncation"); t != nullptr && *t != "disabled")
    bad_request("truncation", "truncation: only \"disabled\" is supported");
  if (const json* inc = field(body, "include")) {
    array_of(*inc, "include");
    for (const auto& v : *inc) {
      if (v != "reasoning.encrypted_content")
        bad_request("include", "include: {} is not supported (reasoning.encrypted_content only)",
                    v.dump());
    }
  }
  if (const json* st = field(body, "service_tier");
      st != nullptr && *st != "auto" && *st != "default") {
    bad_request("service_tier", "service_tier: {} is not supported (auto or default)", st->dump());
  }
  if (const json* so = field(body, "stream_options")) {
    object_of(*so, "stream_options");
    only_fields(*so, {"include_obfuscation"}, "stream_options");
  }
  for (const char* k : {"prompt_cache_key", "user", "safety_identifier"}) {
    if (const json* v = field(body, k)) string_of(*v, k);
  }
  for (const char* k : {"metadata", "client_metadata"}) {
    if (const json* v = field(body, k)) object_of(*v, k);
  }

  json chat;
  if (const json* m = field(body, "model")) chat["model"] = *m;
  if (const json* m = field(body, "max_output_tokens")) chat["max_tokens"] = *m;
  for (const char* k : {"temperature", "top_p", "stream"}) {
    if (const json* v = field(body, k)) chat[k] = *v;
  }
  single_tool = !bool_field(body, "parallel_tool_calls", "").value_or(true);
  if (const json* r = field(body, "reasoning")) {
    object_of(*r, "reasoning");
    only_fields(*r, {"effort", "summary", "generate_summary"}, "reasoning");
    if (const json* e = field(*r, "effort")) {
      const std::string v = string_of(*e, "reasoning.effort");
      if (v == "none") {
        chat["thinking"] = false;
      } else {
        chat["reasoning_effort"] = k3_effort(v, "reasoning.effort");
      }
    }
  }
  convert_text_format(body, chat);

  json messages = json::array();
  if (const json* ins = field(body, "instructions"))
    messages.push_back({{"role", "system"}, {"content", string_of(*ins, "instructions")}});
  ImageGate gate(images);
  convert_input(body, messages, gate);
  if (messages.empty()) bad_request("input", "input: at least one item is required");
  if (messages.back()["role"] == "assistant") {
    bad_request("input",
                "input: the last item is the assistant's (continuing an answer is not supported: "
                "K3's prompt always opens a new assistant turn)");
  }
  chat["messages"] = messages;
  json tools = convert_tools(body, chat);
  if (!tools.empty()) chat["tools"] = tools;
  return chat;
}

// The Responses wire: output items opened and closed as K3's channels change.
class ResponsesWire final : public PartsWire {
 public:
  ResponsesWire(const json& request_echo, bool single_tool)
      : PartsWire(single_tool),
        echo_(request_echo),
        id_(random_id("resp_")),
        created_(static_cast<int64_t>(std::time(nullptr))),
        single_tool_(single_tool) {}

  std::string begin() override {
    const json r = snapshot("in_progress", nullptr);
    std::string out = event("response.created", {{"response", r}});  // numbered in this order
    return out + event("response.in_progress", {{"response", r}});
  }

  std::string end(const Outcome& o) override {
    std::string out = close();
    const bool incomplete = o.stop == StopReason::kLength || o.stop == StopReason::kContext;
    const json r = final_response(o);
    out += event(incomplete ? "response.incomplete" : "response.completed", {{"response", r}});
    return out;
  }

  std::string failure(const ApiError& e) override {
    std::string out = close();
    json r = snapshot("failed", nullptr);
    r["error"] = {{"code", e.code().value_or(e.type())}, {"message", e.what()}};
    return out + event("response.failed", {{"response", r}});
  }

  json response(const Outcome& o) override { return final_response(o); }

 private:
  std::string opened(Part& p) override {
    p.id = random_id(p.kind == Kind::thinking ? "rs_" : p.kind == Kind::text ? "msg_" : "fc_");
    if (p.kind == Kind::tool) p.call_id = random_id("call_");
    std::string out = event("response.output_item.added",
                            {{"output_index", index()}, {"item", item_json(p, false)}});
    if (p.kind != Kind::tool) {
      out += event("response.content_part.added", {{"item_id", p.id},
                                                   {"output_index", index()},
                                                   {"content_index", 0},
                                                   {"part", part_json(p, "")}});
    }
    return out;
  }

  std::string appended(const Part& p, const std::string& text) override {
    if (p.kind == Kind::tool) {
      return event("response.function_call_arguments.delta",
                   {{"item_id", p.id}, {"output_index", index()}, {"delta", text}});
    }
    json d = content_fields(p, "delta", text);
    if (p.kind == Kind::text) d["logprobs"] = json::array();
    return event(
        p.kind == Kind::text ? "response.output_text.delta" : "response.reasoning_text.delta", d);
  }

  std::string closed(const Part& p) override {
    std::string out;
    if (p.kind == Kind::tool) {
      out += event(
          "response.function_call_arguments.done",
          {{"item_id", p.id}, {"output_index", index()}, {"name", p.name}, {"arguments", p.text}});
    } else {
      json done = content_fields(p, "text", p.text);
      if (p.kind == Kind::text) done["logprobs"] = json::array();
      out +=
          event(p.kind == Kind::text ? "response.output_text.done" : "response.reasoning_text.done",
                done);
      out += event("response.content_part.done", {{"item_id", p.id},
                                                  {"output_index", index()},
                                                  {"content_index", 0},
                                                  {"part", part_json(p, p.text)}});
    }
    out += event("response.output_item.done",
                 {{"output_index", index()}, {"item", item_json(p, true)}});
    return out;
  }

  size_t index() const { return parts().size() - 1; }

  std::string event(const char* type, json fields) {
    json j;
    j["type"] = type;
    j["sequence_number"] = seq_++;
    for (auto& [k, v] : fields.items()) j[k] = std::move(v);
    return fmt::format("event: {}\ndata: {}\n\n", type, dump(j));
  }

  json content_fields(const Part& p, const char* key, const std::string& text) const {
    return {{"item_id", p.id}, {"output_index", index()}, {"content_index", 0}, {key, text}};
  }

  static json part_json(const Part& p, const std::string& text) {
    if (p.kind == Kind::thinking) return {{"type", "reasoning_text"}, {"text", text}};
    return {{"type", "output_text"},
            {"annotations", json::array()},
            {"logprobs", json::array()},
            {"text", text}};
  }

  static json item_json(const Part& p, bool done) {
    const char* status = done ? "completed" : "in_progress";
    json content = json::array();
    if (done) content.push_back(part_json(p, p.text));
    switch (p.kind) {
      case Kind::thinking:
        return {{"id", p.id},
                {"type", "reasoning"},
                {"summary", json::array()},
                {"content", content},
                {"status", status}};
      case Kind::tool:
        return {{"id", p.id},           {"type", "function_call"},
                {"status", status},     {"arguments", done ? p.text : ""},
                {"call_id", p.call_id}, {"name", p.name}};
      default:
        return {{"id", p.id},
                {"type", "message"},
                {"status", status},
                {"content", content},
                {"role", "assistant"}};
    }
  }

  json snapshot(const char* status, const json& usage) const {
    json r;
    r["id"] = id_;
    r["object"] = "response";
    r["created_at"] = created_;
    r["status"] = status;
    r["background"] = false;
    r["error"] = nullptr;
    r["incomplete_details"] = nullptr;
    for (const char* k : {"instructions", "max_output_tokens", "temperature", "top_p"})
      r[k] = echo_.contains(k) ? echo_[k] : json(nullptr);
    r["model"] = echo_["model"];
    json output = json::array();
    if (std::string(status) != "in_progress") {
      for (const auto& p : parts()) output.push_back(item_json(p, true));
    }
    r["output"] = output;
    r["parallel_tool_calls"] = !single_tool_;
    r["previous_response_id"] = nullptr;
    r["reasoning"] = echo_.value("reasoning", json({{"effort", nullptr}, {"summary", nullptr}}));
    r["store"] = false;
    r["text"] = echo_.value("text", json({{"format", {{"type", "text"}}}}));
    r["tool_choice"] = echo_.value("tool_choice", json("auto"));
    r["tools"] = echo_.value("tools", json::array());
    r["truncation"] = "disabled";
    r["usage"] = usage;
    r["metadata"] = echo_.value("metadata", json::object());
    return r;
  }

  json final_response(const Outcome& o) const {
    const Usage& u = o.usage;
    // K3 writes its thinking before the answer: the think channel's tokens are those of the
    // reasoning items, counted here by their text's share of the output.
    int64_t reasoning_tokens = 0;
    size_t reasoning_bytes = 0, all_bytes = 0;
    for (const auto& p : parts()) {
      all_bytes += p.text.size();
      if (p.kind == Kind::thinking) reasoning_bytes += p.text.size();
    }
    if (all_bytes > 0) {
      reasoning_tokens = static_cast<int64_t>(static_cast<double>(u.completion_tokens) *
                                              static_cast<double>(reasoning_bytes) /
                                              static_cast<double>(all_bytes));
    }
    json usage = {{"input_tokens", u.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                  {"output_tokens", u.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                  {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    const bool incomplete = o.stop == StopReason::kLength || o.stop == StopReason::kContext;
    json r = snapshot(incomplete ? "incomplete" : "completed", usage);
    if (incomplete) {
      r["incomplete_details"] = {
          {"reason", o.stop == StopReason::kContext ? "max_context" : "max_output_tokens"}};
    }
    return r;
  }

  json echo_;  // the request fields a response object repeats
  std::string id_;
  int64_t created_;
  bool single_tool_;
  int64_t seq_ = 0;
};

json responses_to_chat_impl(const json& body, const ImagePolicy& images) {
  bool single = false;
  return convert(body, single, images);
}

Translation responses_create_impl(const json& body, const ServeLimits& limits,
                                  const Tokenizer& tok) {
  bool single = false;
  const json chat = convert(body, single, limits.images);
  ServeRequest r = to_engine(chat, limits, tok);
  json echo;
  for (const char* k : {"instructions", "max_output_tokens", "temperature", "top_p", "reasoning",
                        "text", "tool_choice", "tools", "metadata"}) {
    if (const json* v = field(body, k)) echo[k] = *v;
  }
  echo["model"] = limits.model_id;
  auto wire = std::make_unique<ResponsesWire>(echo, single);
  return {std::move(r), std::move(wire)};
}

}  // namespace translate::responses

using json = nlohmann::ordered_json;

json responses_to_chat(const json& body, const ImagePolicy& images) {
  return translate::responses::responses_to_chat_impl(body, images);
}

Translation responses_create(const json& body, const ServeLimits& limits, const Tokenizer& tok) {
  return translate::responses::responses_create_impl(body, limits, tok);
}

}  // namespace deltafin::server
