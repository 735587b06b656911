// `deltafin render`: an OpenAI-style chat request body -> the exact prompt, in the model's chat
// format (K3's XTML, or the K2 family's; decided from the model folder as the server decides it,
// tokenizer/chat_format.h; --chat-format overrides the rule).
//
// For checking prompts byte for byte against the reference and for debugging what the server
// feeds the model. The text is printed as is (no newline added, so it can be compared with a
// golden string directly); --json adds the ids, which are what the model actually sees (only the
// renderer's structure is special tokens). A request the reference rejects exits 1 with the
// reason on stderr. Image parts (data URLs) need a model folder with a vision tower: its plan
// gives each image's token count from the headers.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "engine/vision_encoder.h"
#include "runtime/images.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_check.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::cli {

namespace {

struct RenderOptions {
  std::string model;
  std::string request;
  std::string format = "auto";
  bool json = false;
};

std::string read_request(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--request {}: cannot open for reading", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("--request {}: read error", path);
  return data;
}

void run_render(const RenderOptions& o) {
  std::optional<ChatFormat> format;
  if (o.format != "auto") {
    format = parse_chat_format(o.format);
    if (!format)
      fail_usage("--chat-format {}: unknown (expected auto, {})", o.format, chat_format_names());
  }
  const std::string text = read_request(o.request);
  nlohmann::ordered_json body;
  check_json_depth(text, kMaxJsonDepth, "--request " + o.request);
  try {
    body = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_arg("--request {}: invalid JSON: {}", o.request, json_error_text(e));
  }
  const std::string dir = resolve_model_dir(o.model);
  Tokenizer tok = Tokenizer::load(dir);
  if (format) tok = tok.with_chat_format(*format);
  // The server's checks: what it refuses, render refuses too (image parts go to the renderer,
  // which measures them with the model's tower or refuses them when it has none).
  check_chat_body(body, tok.chat_format(), /*images=*/true);
  const ChatRequest request = ChatRequest::from_json(body);
  // Image parts are measured by the model's tower (headers only), opened only when needed.
  std::unique_ptr<VisionEncoder> vision;
  for (const ChatMessage& m : request.messages) {
    if (!m.images.empty() && !vision) vision = VisionEncoder::open(dir);
  }
  const RenderedPrompt prompt = render(request, tok, image_measurer(vision.get()));
  std::string out;
  if (o.json) {
    nlohmann::ordered_json j = {{"text", prompt.text}, {"ids", prompt.ids}};
    if (!prompt.images.empty()) j["images"] = images_json(prompt.images);
    out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } else {
    out = prompt.text;
  }
  write_stdout(out);
}

}  // namespace

void register_render(CLI::App& app) {
  auto opts = std::make_shared<RenderOptions>();
  CLI::App* sub = app.add_subcommand(
      "render",
      "Render an OpenAI-style chat request into the exact prompt in the model's chat format (K3, "
      "or the K2 family's) and print it (the text as is, or with --json the text and its token "
      "ids)");
  add_tokenizer_model_option(sub, opts->model);
  sub->add_option("--request", opts->request,
                  "Chat request body as JSON ('-' reads stdin): messages, and optionally tools, "
                  "tool_choice, response_format, reasoning_effort (low|high|max, default max), "
                  "thinking (default true), add_generation_prompt (default true)")
      ->required();
  sub->add_option("--chat-format", opts->format,
                  "The chat format to render in: auto (default: decided from the model folder's "
                  "special-token names, chat template and config.json), or one of " +
                      chat_format_names());
  sub->add_flag("--json", opts->json,
                "Print one JSON object {\"text\": ..., \"ids\": [...]} and a newline instead of "
                "the bare prompt text; with image parts also \"images\": each image's size, "
                "SHA-256 and token spans (\"segment\" from <|media_begin|> to after "
                "<|media_end|>, \"pads\" its <|media_pad|> run)");
  sub->callback([opts] { run_render(*opts); });
}

}  // namespace deltafin::cli
