// The chat-format rule (chat_format.h) and the evidence it reads. Only three facts are read from
// the folder (the template text, config.json's model_type and architectures); the rest of
// config.json is the model loader's to validate.
#include "tokenizer/chat_format.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

namespace {

namespace fs = std::filesystem;

// A chat template is a few KiB; anything near this is not one.
constexpr std::uintmax_t kMaxTemplateBytes = 1 << 20;

struct FormatName {
  ChatFormat format;
  const char* name;
};

constexpr FormatName kNames[] = {
    {ChatFormat::k3, "k3"},
    {ChatFormat::k2_instruct, "k2-instruct"},
    {ChatFormat::k2_thinking, "k2-thinking"},
    {ChatFormat::k2_5, "k2.5"},
    {ChatFormat::kimi_linear, "kimi-linear"},
};

bool has_all(const Tokenizer& tok, std::initializer_list<const char*> names) {
  return std::all_of(names.begin(), names.end(),
                     [&](const char* n) { return tok.special_id(n).has_value(); });
}

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

std::string template_from_config(const fs::path& path) {
  const nlohmann::json cfg = parse_json(read_regular_file(path.string()), path.string());
  if (!cfg.is_object()) return {};  // Tokenizer::load names this problem
  const auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // Hugging Face's named templates: [{"name": "default", "template": "..."}, ...].
    for (const auto& t : *it) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          !t.contains("template") || !t["template"].is_string()) {
        fail("{}: chat_template: expected a string or a list of {{\"name\", \"template\"}} objects",
             path.string());
      }
      if (t["name"] == "default") return t["template"].get<std::string>();
    }
    return {};
  }
  fail(
      "{}: chat_template: expected a string or a list of {{\"name\", \"template\"}} objects, got "
      "{}",
      path.string(), json_type_name(it->type()));
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  for (const auto& n : kNames) {
    if (n.format == f) return n.name;
  }
  return "k3";
}

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& n : kNames) {
    if (name == n.name) return n.format;
  }
  return std::nullopt;
}

std::string chat_format_names() {
  std::string out;
  for (const auto& n : kNames) {
    if (!out.empty()) out += ", ";
    out += n.name;
  }
  return out;
}

bool is_k2_family(ChatFormat f) {
  return f != ChatFormat::k3;
}

bool format_thinks(ChatFormat f) {
  return f == ChatFormat::k3 || f == ChatFormat::k2_thinking || f == ChatFormat::k2_5;
}

ChatFormatEvidence read_chat_format_evidence(const std::string& dir) {
  ChatFormatEvidence ev;
  const fs::path base(dir);
  if (const fs::path cfg = base / Tokenizer::kConfigFile; present(cfg))
    ev.chat_template = template_from_config(cfg);
  if (const fs::path jinja = base / "chat_template.jinja";
      ev.chat_template.empty() && present(jinja)) {
    require_regular_file(jinja.string());
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(jinja, ec);
    if (!ec && size > kMaxTemplateBytes) {
      fail("{}: {} bytes; a chat template is expected to be at most {} bytes", jinja.string(), size,
           kMaxTemplateBytes);
    }
    ev.chat_template = read_regular_file(jinja.string());
  }
  if (const fs::path config = base / "config.json"; present(config)) {
    const nlohmann::json c = parse_json(read_regular_file(config.string()), config.string());
    if (c.is_object()) {
      if (const auto it = c.find("model_type"); it != c.end() && it->is_string())
        ev.model_type = it->get<std::string>();
      if (const auto it = c.find("architectures"); it != c.end() && it->is_array()) {
        for (const auto& a : *it) {
          if (a.is_string()) ev.architectures.push_back(a.get<std::string>());
        }
      }
    }
  }
  return ev;
}

ChatFormat chat_format_for(const Tokenizer& tok, const ChatFormatEvidence& ev) {
  if (has_all(tok, {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"})) return ChatFormat::k3;
  if (!has_all(tok, {"<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                     "<|im_end|>"})) {
    return ChatFormat::k3;
  }
  const auto arch = [&](const char* a) {
    return std::find(ev.architectures.begin(), ev.architectures.end(), a) != ev.architectures.end();
  };
  if (ev.model_type == "kimi_linear" || arch("KimiLinearForCausalLM"))
    return ChatFormat::kimi_linear;
  if (ev.model_type == "kimi_k25" || arch("KimiK25ForConditionalGeneration"))
    return ChatFormat::k2_5;
  if (!ev.chat_template.empty()) {
    return ev.chat_template.find("<think>") != std::string::npos ? ChatFormat::k2_thinking
                                                                 : ChatFormat::k2_instruct;
  }
  return tok.special_id("<think>") ? ChatFormat::k2_thinking : ChatFormat::k2_instruct;
}

std::vector<int32_t> chat_stop_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  const auto add = [&](const char* name) {
    if (const auto id = tok.special_id(name)) ids.push_back(*id);
  };
  if (is_k2_family(tok.chat_format())) {
    add("<|im_end|>");
    add("[EOS]");
  } else {
    add("<|end_of_msg|>");
  }
  return ids;
}

}  // namespace deltafin
