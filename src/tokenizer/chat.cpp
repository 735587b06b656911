// K3 chat rendering (docs/MODEL.md §5.3). The rules mirror llama.cpp's Kimi-K3 template, which was
// written to match Moonshot's `encoding_k3.py`; where the template is loose (it silently skips
// non-object messages and unknown roles) the request is rejected instead, by field path.
//
// Prompt order: tool declaration, thinking effort, the messages, tool choice, response format,
// generation prompt. A PromptBuilder collects the output as "marker" or "text" segments and
// encodes each stretch of text between two markers with encode_ordinary.
#include "tokenizer/chat.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/json_text.h"
#include "tokenizer/utf8.h"

namespace deltafin {

namespace {

using json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Request parsing.

const json* find(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

// Python's str() of a scalar, which is what the template's `|string` produces for ids and
// names. Objects and arrays are rejected.
std::string py_str(const json& v, const std::string& path) {
  switch (v.type()) {
    case json::value_t::string:
      return v.get<std::string>();
    case json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float:
      return python_float_repr(v.get<double>());
    default:
      fail_arg("{}: expected a string, got {}", path, type_name(v));
  }
}

// Jinja/Python truthiness of a scalar name: "", 0, false and null mean "no name".
bool truthy_scalar(const json& v, const std::string& path) {
  switch (v.type()) {
    case json::value_t::null:
      return false;
    case json::value_t::string:
      return !v.get_ref<const std::string&>().empty();
    case json::value_t::boolean:
      return v.get<bool>();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return v.get<int64_t>() != 0;
    case json::value_t::number_float:
      return v.get<double>() != 0.0;
    default:
      fail_arg("{}: expected a string, got {}", path, type_name(v));
  }
}

// `image_url`'s URL as bytes: only a base64 data URL of an image type is taken (the engine
// never fetches a URL a client names).
ChatImage parse_data_url(const json& url, const std::string& path) {
  if (!url.is_string())
    fail_arg("{}: expected a data URL string (data:image/png;base64,...), got {}", path,
             type_name(url));
  const std::string& u = url.get_ref<const std::string&>();
  auto lower_prefix = [&](std::string_view p) {
    if (u.size() < p.size()) return false;
    for (size_t i = 0; i < p.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(u[i])) != p[i]) return false;
    }
    return true;
  };
  if (lower_prefix("http://") || lower_prefix("https://")) {
    fail_arg(
        "{}: remote image URLs are not fetched; send the image inline as a data URL "
        "(data:image/png;base64,...)",
        path);
  }
  if (!lower_prefix("data:"))
    fail_arg("{}: expected a data URL (data:image/png;base64,...), got \"{}\"", path,
             utf8::py_strip(u.substr(0, std::min<size_t>(u.size(), 32))));
  const size_t comma = u.find(',');
  if (comma == std::string::npos)
    fail_arg("{}: the data URL has no ',' before its data (expected data:image/png;base64,...)",
             path);
  const std::string_view header = std::string_view(u).substr(5, comma - 5);
  constexpr std::string_view kB64 = ";base64";
  if (header.size() < kB64.size() || header.substr(header.size() - kB64.size()) != kB64)
    fail_arg("{}: the data URL is not base64 (expected data:image/png;base64,...)", path);
  ChatImage img;
  img.media_type = std::string(header.substr(0, header.find(';')));
  if (img.media_type.rfind("image/", 0) != 0) {
    fail_arg(
        "{}: the data URL's type is \"{}\"; expected an image type (image/png, image/jpeg, "
        "image/webp, image/gif)",
        path, img.media_type.substr(0, 64));
  }
  auto bytes = base64::decode(std::string_view(u).substr(comma + 1));
  if (!bytes) fail_arg("{}: the data URL's data is not valid base64", path);
  if (bytes->empty()) fail_arg("{}: the data URL holds no bytes", path);
  img.bytes = std::make_shared<const std::string>(std::move(*bytes));
  return img;
}

// One image part, OpenAI's form or `{"type": "image", ...}` with `image_url` or `url`.
ChatImage parse_image_part(const json& part, const std::string& ppath) {
  const json* iu = find(part, "image_url");
  if (iu != nullptr && iu->is_object()) {
    const json* url = find(*iu, "url");
    if (url == nullptr) fail_arg("{}.image_url.url: missing (expected a data URL)", ppath);
    if (const json* d = find(*iu, "detail"); d != nullptr && !d->is_null() && !d->is_string())
      fail_arg("{}.image_url.detail: expected a string, got {}", ppath, type_name(*d));
    return parse_data_url(*url, ppath + ".image_url.url");
  }
  if (iu != nullptr) return parse_data_url(*iu, ppath + ".image_url");
  if (const json* url = find(part, "url")) return parse_data_url(*url, ppath + ".url");
  fail_arg("{}: an image part needs image_url.url (a data URL)", ppath);
}

// `content`: a string, null/absent (empty), or an array of text and image parts; the text parts
// are joined with nothing between them and each image keeps its place in that text.
void parse_content(const json& msg, const std::string& path, ChatMessage& out) {
  const json* c = find(msg, "content");
  if (c == nullptr || c->is_null()) return;
  if (c->is_string()) {
    out.content = c->get<std::string>();
    return;
  }
  if (!c->is_array()) {
    fail_arg("{}.content: expected a string, an array of content parts or null, got {}", path,
             type_name(*c));
  }
  std::string text;
  for (std::size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string ppath = fmt::format("{}.content[{}]", path, i);
    if (!part.is_object())
      fail_arg("{}: expected a content part object, got {}", ppath, type_name(part));
    if (const json* t = find(part, "type");
        t != nullptr && t->is_string() && (*t == "image" || *t == "image_url")) {
      ChatImage img = parse_image_part(part, ppath);
      img.name = ppath;
      img.offset = text.size();
      out.images.push_back(std::move(img));
      continue;
    }
    const json* t = find(part, "text");
    if (t == nullptr || !t->is_string()) fail_arg("{}.text: expected a string", ppath);
    text += t->get<std::string>();
  }
  out.content = std::move(text);
}

std::optional<std::string> optional_text(const json& msg, const char* key,
                                         const std::string& path) {
  const json* v = find(msg, key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return py_str(*v, path + "." + key);
}

ChatToolCall parse_tool_call(const json& tc, const std::string& path) {
  if (!tc.is_object()) fail_arg("{}: Kimi K3 tool calls must be mappings.", path);
  ChatToolCall call;
  if (const json* id = find(tc, "id"); id != nullptr && !id->is_null())
    call.id = py_str(*id, path + ".id");
  const json* fnp = find(tc, "function");
  const bool nested = fnp != nullptr && fnp->is_object();
  const json& fn = nested ? *fnp : tc;
  const std::string fpath = nested ? path + ".function" : path;
  const json* name = find(fn, "name");
  if (name == nullptr || name->is_null())
    fail_arg("{}.name: Kimi K3 tool calls require a function name.", fpath);
  call.name = py_str(*name, fpath + ".name");

  if (const json* block = find(fn, "_xtml_json_block"); block != nullptr && !block->is_null()) {
    call.args_kind = ChatToolCall::Args::json_block;
    call.json_block = py_str(*block, fpath + "._xtml_json_block");
    return call;
  }
  const json* args = find(fn, "arguments");
  if (args == nullptr) {
    call.args_kind = ChatToolCall::Args::object;  // the template's default {} renders nothing
    return call;
  }
  if (args->is_null()) return call;
  if (args->is_object()) {
    call.args_kind = ChatToolCall::Args::object;
    call.arguments = *args;
    return call;
  }
  if (args->is_string()) {
    const std::string& s = args->get_ref<const std::string&>();
    // OpenAI clients send arguments as a JSON string; a JSON object string becomes typed
    // arguments (key order kept), as the reference encoder does.
    json parsed = json::parse(s, nullptr, /*allow_exceptions=*/false);
    call.arguments_text = s;
    if (parsed.is_object()) {
      call.args_kind = ChatToolCall::Args::object;
      call.arguments = std::move(parsed);
    } else if (!utf8::py_strip(s).empty()) {
      call.args_kind = ChatToolCall::Args::json_block;
      call.json_block = s;
    }
    return call;
  }
  fail_arg("{}.arguments: Kimi K3 tool call arguments must be a mapping or a JSON object string.",
           fpath);
}

ChatMessage parse_message(const json& m, const std::string& path) {
  if (!m.is_object()) fail_arg("{}: expected a message object, got {}", path, type_name(m));
  const json* role = find(m, "role");
  if (role == nullptr) fail_arg("{}: Kimi K3 messages require a role.", path);
  if (!role->is_string()) fail_arg("{}.role: expected a string, got {}", path, type_name(*role));
  ChatMessage msg;
  const std::string& r = role->get_ref<const std::string&>();
  if (r == "system")
    msg.role = ChatMessage::Role::system;
  else if (r == "user")
    msg.role = ChatMessage::Role::user;
  else if (r == "assistant")
    msg.role = ChatMessage::Role::assistant;
  else if (r == "tool")
    msg.role = ChatMessage::Role::tool;
  else
    fail_arg("{}.role: unsupported role \"{}\" (expected system, user, assistant or tool)", path,
             r);

  if (msg.role == ChatMessage::Role::tool) {
    // `tool` wins when the key is present at all (even if null, which then means "unknown").
    if (const json* t = find(m, "tool")) {
      if (!t->is_null()) msg.tool_name = py_str(*t, path + ".tool");
    } else {
      msg.tool_name = optional_text(m, "name", path);
    }
    if (const json* id = find(m, "tool_call_id")) {
      if (!id->is_null()) msg.tool_call_id = py_str(*id, path + ".tool_call_id");
    } else {
      msg.tool_call_id = optional_text(m, "id", path);
    }
  } else if (const json* n = find(m, "name"); n != nullptr && truthy_scalar(*n, path + ".name")) {
    msg.name = py_str(*n, path + ".name");
  }

  if (msg.role == ChatMessage::Role::system) {
    if (const json* t = find(m, "tools"); t != nullptr && !t->is_null()) {
      if (!t->is_array())
        fail_arg("{}.tools: expected an array of tools, got {}", path, type_name(*t));
      if (!t->empty()) msg.tools = *t;
    }
  }
  parse_content(m, path, msg);

  if (msg.role == ChatMessage::Role::assistant) {
    // Python `a or b`: an empty reasoning_content falls back to `reasoning`.
    std::optional<std::string> rc = optional_text(m, "reasoning_content", path);
    if (!rc || rc->empty()) {
      std::optional<std::string> alt = optional_text(m, "reasoning", path);
      if (alt) rc = alt;
    }
    msg.reasoning = rc;
    msg.reasoning_content = optional_text(m, "reasoning_content", path);
    if (const json* tcs = find(m, "tool_calls"); tcs != nullptr && !tcs->is_null()) {
      if (!tcs->is_array())
        fail_arg("{}.tool_calls: expected an array, got {}", path, type_name(*tcs));
      for (std::size_t i = 0; i < tcs->size(); ++i) {
        msg.tool_calls.push_back(
            parse_tool_call((*tcs)[i], fmt::format("{}.tool_calls[{}]", path, i)));
      }
    }
  }
  return msg;
}

void check_effort(const ChatRequest& req) {
  if (req.thinking && req.reasoning_effort) {
    const std::string& e = *req.reasoning_effort;
    if (e != "low" && e != "high" && e != "max") {
      fail_arg("Unsupported thinking_effort={}; supported values are low, high, and max.", e);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

class PromptBuilder {
 public:
  // `markers`: the K3 chat structure is written (false: a raw prompt with images only).
  PromptBuilder(const Tokenizer* tok, const ImageMeasurer* measure, bool markers = true)
      : tok_(tok), measure_(measure) {
    if (tok_ == nullptr || !markers) return;
    const char* names[4] = {kOpenMarker, kCloseMarker, kSepMarker, kEndOfMsgMarker};
    for (int i = 0; i < 4; ++i) {
      const auto id = tok_->special_id(names[i]);
      if (!id) fail("tokenizer has no special token {}, which the K3 chat format needs", names[i]);
      ids_[i] = *id;
    }
  }

  using Attrs = std::vector<std::pair<std::string, std::string>>;

  void open(std::string_view tag, const Attrs& attrs = {}) {
    marker(0);
    text(tag);
    for (const auto& [k, v] : attrs) {
      text(" ");
      text(k);
      text("=\"");
      text(escape_attr(v));
      text("\"");
    }
    marker(2);
  }
  void close(std::string_view tag) {
    marker(1);
    text(tag);
    marker(2);
  }
  void end_of_msg() { marker(3); }
  void text(std::string_view s) {
    out_.text += s;
    pending_ += s;
  }

  // A message's text with its images at their places (docs/VISION.md §6): each image is
  // <|media_begin|>image WxH<|media_content|> N × <|media_pad|> <|media_end|>.
  void content(const ChatMessage& m) {
    size_t at = 0;
    for (const ChatImage& img : m.images) {
      const size_t off = std::min(img.offset, m.content.size());
      text(std::string_view(m.content).substr(at, off - at));
      at = std::max(at, off);
      image(img);
    }
    text(std::string_view(m.content).substr(at));
  }

  // OPEN(message, role=system, type=T) body CLOSE(message) EOM, body trimmed.
  void internal_system(std::string_view type, std::string_view body) {
    open("message", {{"role", "system"}, {"type", std::string(type)}});
    text(utf8::py_strip(body));
    close("message");
    end_of_msg();
  }

  RenderedPrompt finish() {
    flush();
    return std::move(out_);
  }
  // Ids so far (after the last marker: text between markers is encoded as one run).
  int64_t mark() {
    flush();
    return static_cast<int64_t>(out_.ids.size());
  }
  RenderedPrompt& out() { return out_; }

 private:
  static std::string escape_attr(std::string_view v) {
    std::string out;
    for (const char c : v) {
      if (c == '&')
        out += "&amp;";
      else if (c == '"')
        out += "&quot;";
      else
        out += c;
    }
    return out;
  }
  void flush() {
    if (tok_ != nullptr && !pending_.empty()) tok_->encode_ordinary_append(pending_, out_.ids);
    pending_.clear();
  }
  void marker(int which) {
    static const char* names[4] = {kOpenMarker, kCloseMarker, kSepMarker, kEndOfMsgMarker};
    flush();
    out_.text += names[which];
    if (tok_ != nullptr) out_.ids.push_back(ids_[which]);
  }

  void image(const ChatImage& img) {
    if (measure_ == nullptr || !*measure_) {
      fail_arg("{}: image parts need a model with a vision tower (this model is text only)",
               img.name);
    }
    const ImageMeasure m = (*measure_)(img);
    if (m.width <= 0 || m.height <= 0 || m.tokens <= 0)
      fail("{}: the image measured {}x{} with {} tokens", img.name, m.width, m.height, m.tokens);
    static const char* names[4] = {"<|media_begin|>", "<|media_content|>", "<|media_pad|>",
                                   "<|media_end|>"};
    int32_t media[4] = {0, 0, 0, 0};
    if (tok_ != nullptr) {
      for (int i = 0; i < 4; ++i) {
        const auto id = tok_->special_id(names[i]);
        if (!id) fail("tokenizer has no special token {}, which an image needs", names[i]);
        media[i] = *id;
      }
    }
    PromptImage p;
    p.bytes = img.bytes;
    p.name = img.name;
    p.width = m.width;
    p.height = m.height;
    p.hash = m.hash;
    flush();
    p.segment_begin = static_cast<int64_t>(out_.ids.size());
    out_.text += names[0];
    if (tok_ != nullptr) out_.ids.push_back(media[0]);
    text(fmt::format("image {}x{}", m.width, m.height));
    flush();
    out_.text += names[1];
    out_.text += names[2];
    out_.text += names[3];
    if (tok_ != nullptr) {
      out_.ids.push_back(media[1]);
      p.pad_begin = static_cast<int64_t>(out_.ids.size());
      p.tokens = m.tokens;
      out_.ids.insert(out_.ids.end(), static_cast<size_t>(m.tokens), media[2]);
      out_.ids.push_back(media[3]);
      p.segment_end = static_cast<int64_t>(out_.ids.size());
    }
    out_.images.push_back(std::move(p));
  }

  const Tokenizer* tok_;
  const ImageMeasurer* measure_;
  int32_t ids_[4] = {0, 0, 0, 0};
  std::string pending_;
  RenderedPrompt out_;
};

void tool_declare(PromptBuilder& b, const json& tools, bool dynamic) {
  b.open("message", {{"role", "system"}, {"type", "tool-declare"}});
  if (dynamic) {
    b.text(
        "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
        "You have access to all existing and extended tools.\n"
        "Here are the specs for the extended tools.\n\n```json\n");
  } else {
    b.text("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n");
  }
  b.text(python_json(tools, JsonStyle::compact_sorted));
  b.text("\n```");
  b.close("message");
  b.end_of_msg();
}

const char* xtml_type(const json& v) {
  switch (v.type()) {
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::object:
      return "object";
    default:
      return "array";
  }
}

void render_assistant(PromptBuilder& b, const ChatMessage& m, bool thinking) {
  if (thinking) {
    b.open("think");
    if (m.reasoning && !utf8::py_strip(*m.reasoning).empty()) b.text(*m.reasoning);
    b.close("think");
  }
  b.open("response");
  b.content(m);
  b.close("response");
  if (m.tool_calls.empty()) return;
  b.open("tools");
  for (std::size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ChatToolCall& call = m.tool_calls[k];
    b.open("call", {{"tool", call.name}, {"index", std::to_string(k + 1)}});
    if (call.args_kind == ChatToolCall::Args::json_block) {
      b.open("json", {{"type", "object"}});
      b.text(call.json_block);
      b.close("json");
    } else if (call.args_kind == ChatToolCall::Args::object) {
      for (const auto& [key, value] : call.arguments.items()) {
        b.open("argument", {{"key", key}, {"type", xtml_type(value)}});
        b.text(value.is_string() ? value.get_ref<const std::string&>()
                                 : python_json(value, JsonStyle::python_default));
        b.close("argument");
      }
    }
    b.close("call");
  }
  b.close("tools");
}

struct ToolState {
  const std::vector<ChatToolCall>* calls = nullptr;  // the last assistant turn's calls
  std::size_t index = 0;                             // tool results since that turn
};

void render_tool_result(PromptBuilder& b, const ChatMessage& m, ToolState& st,
                        const std::optional<std::string>& resolved, std::size_t msg_index) {
  ++st.index;
  std::optional<std::string> name = resolved ? resolved : m.tool_name;
  if (!name && st.calls != nullptr && st.index <= st.calls->size())
    name = (*st.calls)[st.index - 1].name;
  if (!name) {
    fail_arg(
        "messages[{}]: Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, "
        "or match a preceding assistant tool_call by order.",
        msg_index);
  }
  b.open("message", {{"role", "tool"}, {"tool", *name}, {"index", std::to_string(st.index)}});
  b.content(m);
  b.close("message");
  b.end_of_msg();
}

// A run of consecutive tool results: in call order when every result names a call of the last
// assistant turn (each then named after its call), else as given.
void render_tool_run(PromptBuilder& b, const std::vector<ChatMessage>& msgs, std::size_t begin,
                     std::size_t end, ToolState& st) {
  const auto matches = [](const ChatToolCall& c, const ChatMessage& m) {
    return c.id && m.tool_call_id && *c.id == *m.tool_call_id;
  };
  bool all_resolved = st.calls != nullptr;
  for (std::size_t i = begin; i < end && all_resolved; ++i) {
    bool found = false;
    for (const auto& c : *st.calls) found = found || matches(c, msgs[i]);
    all_resolved = found;
  }
  if (!all_resolved) {
    for (std::size_t i = begin; i < end; ++i) render_tool_result(b, msgs[i], st, std::nullopt, i);
    return;
  }
  std::vector<std::string> emitted;
  for (const auto& c : *st.calls) {
    if (!c.id || std::find(emitted.begin(), emitted.end(), *c.id) != emitted.end()) continue;
    emitted.push_back(*c.id);
    for (std::size_t i = begin; i < end; ++i) {
      if (matches(c, msgs[i])) render_tool_result(b, msgs[i], st, c.name, i);
    }
  }
}

RenderedPrompt render_with(const ChatRequest& req, const Tokenizer* tok,
                           const ImageMeasurer* measure) {
  check_effort(req);
  PromptBuilder b(tok, measure);
  if (!req.tools.empty()) tool_declare(b, req.tools, /*dynamic=*/false);
  if (req.thinking && req.reasoning_effort) {
    b.internal_system("thinking-effort",
                      "`thinking_effort` guides on how much to think in your thinking channel (not "
                      "including the response channel), supported values include `low`, `medium`, "
                      "`high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
                          *req.reasoning_effort + "`.");
  }
  ToolState st;
  const auto& msgs = req.messages;
  int64_t system_end = b.mark();
  bool leading = true;  // still in the leading system messages
  int64_t last_message = 0;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (i + 1 == msgs.size()) last_message = b.mark();
    if (i > 0 && leading) {
      if (msgs[i - 1].role == ChatMessage::Role::system)
        system_end = b.mark();
      else
        leading = false;
    }
    switch (m.role) {
      case ChatMessage::Role::system:
        if (m.tools) {
          tool_declare(b, *m.tools, /*dynamic=*/true);
          break;
        }
        [[fallthrough]];
      case ChatMessage::Role::user: {
        PromptBuilder::Attrs attrs = {
            {"role", m.role == ChatMessage::Role::user ? "user" : "system"}};
        if (!m.name.empty()) attrs.emplace_back("name", m.name);
        b.open("message", attrs);
        b.content(m);
        b.close("message");
        b.end_of_msg();
        break;
      }
      case ChatMessage::Role::assistant: {
        st.calls = &m.tool_calls;
        st.index = 0;
        PromptBuilder::Attrs attrs = {{"role", "assistant"}};
        if (!m.name.empty()) attrs.emplace_back("name", m.name);
        b.open("message", attrs);
        render_assistant(b, m, req.thinking);
        b.close("message");
        b.end_of_msg();
        break;
      }
      case ChatMessage::Role::tool: {
        if (i > 0 && msgs[i - 1].role == ChatMessage::Role::tool) break;  // rendered with its run
        std::size_t end = i;
        while (end < msgs.size() && msgs[end].role == ChatMessage::Role::tool) ++end;
        render_tool_run(b, msgs, i, end, st);
        break;
      }
    }
  }
  if (leading && !msgs.empty() && msgs.back().role == ChatMessage::Role::system)
    system_end = b.mark();
  const int64_t messages_end = b.mark();
  if (req.tool_choice == ChatRequest::ToolChoice::required) {
    b.internal_system("tool-choice",
                      "The system is invoked with `tool_choice=required`.\nYou MUST call tools in "
                      "the next message.");
  } else if (req.tool_choice == ChatRequest::ToolChoice::none) {
    b.internal_system("tool-choice",
                      "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools "
                      "in the next message.");
  }
  static constexpr std::string_view kRawJson =
      "Your response must be raw JSON data without markdown code blocks (```json) or any "
      "additional formatting.";
  if (req.response_format == ChatRequest::ResponseFormat::json_object) {
    b.internal_system(
        "response-format",
        "The system is invoked with `response_format=json_object`.\n" + std::string(kRawJson));
  } else if (req.response_format == ChatRequest::ResponseFormat::json_schema) {
    b.internal_system("response-format",
                      "The system is invoked with `response_format=json_schema`.\n" +
                          std::string(kRawJson) +
                          "\nThe JSON data must match the following schema:\n```json\n" +
                          python_json(req.response_schema, JsonStyle::compact_sorted) + "\n```");
  }
  if (req.add_generation_prompt) {
    b.open("message", {{"role", "assistant"}});
    b.open(req.thinking ? "think" : "response");
  }
  if (tok != nullptr) {
    b.out().system_end = system_end;
    b.out().messages_end = messages_end;
    b.out().last_message = last_message;
  }
  return b.finish();
}

}  // namespace

ChatRequest ChatRequest::from_json(const json& body) {
  if (!body.is_object()) fail_arg("request: expected a JSON object, got {}", type_name(body));
  ChatRequest req;

  if (const json* t = find(body, "thinking"); t != nullptr && !t->is_null()) {
    if (t->is_boolean()) {
      req.thinking = t->get<bool>();
    } else if (t->is_object() && find(*t, "type") != nullptr && (*t)["type"].is_string() &&
               ((*t)["type"] == "enabled" || (*t)["type"] == "disabled")) {
      req.thinking = (*t)["type"] == "enabled";
    } else {
      fail_arg("thinking: expected true, false or {{\"type\": \"enabled\"|\"disabled\"}}");
    }
  }
  if (const json* e = find(body, "reasoning_effort")) {
    if (e->is_null())
      req.reasoning_effort.reset();
    else if (e->is_string())
      req.reasoning_effort = e->get<std::string>();
    else
      fail_arg("reasoning_effort: expected a string (low, high or max), got {}", type_name(*e));
  }
  check_effort(req);  // the reference checks this before anything else
  if (const json* g = find(body, "add_generation_prompt"); g != nullptr && !g->is_null()) {
    if (!g->is_boolean())
      fail_arg("add_generation_prompt: expected true or false, got {}", type_name(*g));
    req.add_generation_prompt = g->get<bool>();
  }
  if (const json* t = find(body, "tools"); t != nullptr && !t->is_null()) {
    if (!t->is_array()) fail_arg("tools: expected an array of tools, got {}", type_name(*t));
    req.tools = *t;
  }
  if (const json* tc = find(body, "tool_choice"); tc != nullptr && !tc->is_null()) {
    if (tc->is_object()) {
      req.tool_choice = ToolChoice::named;  // the reference renders nothing for a named choice
    } else if (tc->is_string() && *tc == "auto") {
      req.tool_choice = ToolChoice::auto_;
    } else if (tc->is_string() && *tc == "none") {
      req.tool_choice = ToolChoice::none;
    } else if (tc->is_string() && *tc == "required") {
      req.tool_choice = ToolChoice::required;
    } else {
      fail_arg(
          "tool_choice: expected \"auto\", \"none\", \"required\" or a named-function object, got "
          "{}",
          tc->dump());
    }
  }
  if (const json* rf = find(body, "response_format"); rf != nullptr && !rf->is_null()) {
    std::string type;
    if (rf->is_string()) {
      type = rf->get<std::string>();
    } else if (rf->is_object()) {
      if (const json* t = find(*rf, "type"); t != nullptr && !t->is_null()) {
        if (!t->is_string())
          fail_arg("response_format.type: expected a string, got {}", type_name(*t));
        type = t->get<std::string>();
      }
    } else {
      fail_arg("response_format: expected an object, got {}", type_name(*rf));
    }
    if (type.empty() || type == "text") {
      req.response_format = ResponseFormat::text;
    } else if (type == "json_object") {
      req.response_format = ResponseFormat::json_object;
    } else if (type == "json_schema") {
      req.response_format = ResponseFormat::json_schema;
      // schema = json_schema.schema, else json_schema.json_schema, else json_schema itself.
      if (const json* w = rf->is_object() ? find(*rf, "json_schema") : nullptr;
          w != nullptr && !w->is_null()) {
        if (w->is_object() && w->contains("schema"))
          req.response_schema = (*w)["schema"];
        else if (w->is_object() && w->contains("json_schema"))
          req.response_schema = (*w)["json_schema"];
        else
          req.response_schema = *w;
      }
    } else {
      fail_arg(
          "response_format.type: unsupported \"{}\" (expected text, json_object or json_schema)",
          type);
    }
  }
  const json* msgs = find(body, "messages");
  if (msgs == nullptr) fail_arg("messages: missing (expected an array of messages)");
  if (!msgs->is_array())
    fail_arg("messages: expected an array of messages, got {}", type_name(*msgs));
  for (std::size_t i = 0; i < msgs->size(); ++i) {
    req.messages.push_back(parse_message((*msgs)[i], fmt::format("messages[{}]", i)));
  }
  return req;
}

RenderedPrompt render(const ChatRequest& request, const Tokenizer& tokenizer,
                      const ImageMeasurer& measure) {
  if (is_k2_family(tokenizer.chat_format()))
    return render_k2(request, &tokenizer, tokenizer.chat_format());
  return render_with(request, &tokenizer, &measure);
}

std::string render_text(const ChatRequest& request) {
  return render_with(request, nullptr, nullptr).text;
}

std::string render_text(const ChatRequest& request, ChatFormat format) {
  if (is_k2_family(format)) return render_k2(request, nullptr, format).text;
  return render_with(request, nullptr, nullptr).text;
}

RenderedPrompt render_json(const json& body, const Tokenizer& tokenizer,
                           const ImageMeasurer& measure) {
  return render(ChatRequest::from_json(body), tokenizer, measure);
}

void place_images(std::string_view text, std::vector<ChatImage> images, ChatMessage& message) {
  std::vector<size_t> at;
  const std::string_view ph = kImagePlaceholder;
  for (size_t p = text.find(ph); p != std::string_view::npos && at.size() <= images.size();
       p = text.find(ph, p + ph.size()))
    at.push_back(p);
  if (!at.empty() && at.size() != images.size()) {
    fail_arg(
        "the prompt has {} {} but {} image{} given: give one image per placeholder, or no "
        "placeholder to put the images before the text",
        at.size() > images.size() ? "more than " + std::to_string(images.size())
                                  : std::to_string(at.size()),
        kImagePlaceholder, images.size(), images.size() == 1 ? " is" : "s are");
  }
  message.content.clear();
  size_t from = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!at.empty()) {
      message.content += text.substr(from, at[i] - from);
      from = at[i] + ph.size();
    }
    images[i].offset = message.content.size();
    message.images.push_back(std::move(images[i]));
  }
  message.content += text.substr(from);
}

RenderedPrompt encode_with_images(const Tokenizer& tokenizer, const ChatMessage& message,
                                  const ImageMeasurer& measure) {
  PromptBuilder b(&tokenizer, &measure, /*markers=*/false);
  b.content(message);
  return b.finish();
}

std::string image_hash_hex(const std::array<uint8_t, 32>& hash) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const uint8_t b : hash) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::vector<int32_t> state_key_ids(std::span<const int32_t> ids,
                                   std::span<const PromptImage> images) {
  std::vector<int32_t> key(ids.begin(), ids.end());
  for (const PromptImage& img : images) {
    // Each position of the segment carries 31 bits of one of the hash's eight words (in turn),
    // made negative: a segment of n >= 5 positions (an image takes at least 5: begin, the size
    // text, content, a pad, end) carries min(n, 8) · 31 bits of the hash.
    const int64_t end = std::min<int64_t>(img.segment_end, static_cast<int64_t>(key.size()));
    for (int64_t p = std::max<int64_t>(img.segment_begin, 0); p < end; ++p) {
      const size_t w = static_cast<size_t>(p - img.segment_begin) % 8;
      uint32_t word = 0;
      for (size_t k = 0; k < 4; ++k) word = (word << 8) | img.hash[w * 4 + k];
      key[static_cast<size_t>(p)] = -1 - static_cast<int32_t>(word & 0x7fffffffu);
    }
  }
  return key;
}

json content_json(const ChatMessage& m) {
  if (m.images.empty()) return m.content;
  json parts = json::array();
  size_t at = 0;
  auto text_part = [&](size_t end) {
    if (end > at) parts.push_back({{"type", "text"}, {"text", m.content.substr(at, end - at)}});
    at = std::max(at, end);
  };
  for (const ChatImage& img : m.images) {
    text_part(std::min(img.offset, m.content.size()));
    const std::string url = "data:" + img.media_type + ";base64," + base64::encode(*img.bytes);
    parts.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
  }
  text_part(m.content.size());
  return parts;
}

}  // namespace deltafin
