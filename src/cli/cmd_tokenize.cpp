// `deltafin tokenize`: text -> token ids, or ids -> text, with the model's own tokenizer (its
// special-token names are the model's own: K3's and the K2 family's differ at the same ids).
//
// Meant for scripts and for checking ids against a reference, so the output is exact and
// machine-readable: one compact JSON array and a newline when encoding; exactly the decoded
// bytes (no newline, no replacement of invalid UTF-8) when decoding. `--file` content is used
// byte for byte, so texts with trailing newlines, NULs or invalid UTF-8 survive unchanged. With
// --image the images' segments (docs/VISION.md §6) are laid into the text and their spans shown.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "engine/vision_encoder.h"
#include "runtime/images.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool special = false;
  bool decode = false;
  std::vector<std::string> images;
};

std::string read_input_file(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--file {}: cannot open for reading", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("--file {}: read error", path);
  return data;
}

std::vector<int32_t> parse_id_list(const std::string& input, const std::string& source) {
  nlohmann::json j;
  check_json_depth(input, kMaxJsonDepth, source);
  try {
    j = nlohmann::json::parse(input);
  } catch (const nlohmann::json::exception& e) {
    fail_arg("{}: expected a JSON array of token ids: {}", source, json_error_text(e));
  }
  if (!j.is_array()) fail_arg("{}: expected a JSON array of token ids", source);
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
      fail_arg("{}: element {} is {}, expected an integer token id", source, i, v.dump());
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& o, bool have_text, bool have_file) {
  if (have_text == have_file) fail_usage("tokenize: give exactly one of --text and --file");
  const std::string input = have_file ? read_input_file(o.file) : o.text;
  const Tokenizer tok = Tokenizer::load(resolve_model_dir(o.model));
  if (o.decode) {
    const auto ids = parse_id_list(input, have_file ? "--file " + o.file : std::string("--text"));
    for (const int32_t id : ids) tok.check_id(id);
    write_stdout(tok.decode(ids));
    return;
  }
  if (!o.images.empty()) {
    // The text's ordinary tokens with each image's segment at its placeholder (or before it),
    // printed with the images' token spans.
    if (o.special) fail_usage("--image takes ordinary text; it cannot be used with --special");
    std::vector<ChatImage> images;
    for (const auto& path : o.images) images.push_back(read_image_part(path));
    ChatMessage m{ChatMessage::Role::user, "", ""};
    place_images(input, std::move(images), m);
    const auto vision = VisionEncoder::open(resolve_model_dir(o.model));
    const RenderedPrompt p = encode_with_images(tok, m, image_measurer(vision.get()));
    nlohmann::ordered_json j = {{"ids", p.ids}, {"images", images_json(p.images)}};
    write_stdout(j.dump() + "\n");
    return;
  }
  const auto ids = o.special ? tok.encode_with_special(input) : tok.encode_ordinary(input);
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  write_stdout(out);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "Encode text into token ids (one JSON array and a newline on stdout), or with --decode "
      "turn a JSON id list back into exactly its bytes");
  add_tokenizer_model_option(sub, opts->model);
  sub->add_flag("--special", opts->special,
                "Recognise the model's special-token strings (names from its "
                "tokenizer_config.json: <|open|> in K3, <|im_end|> in the K2 family, [EOS] in "
                "both) as their special ids (trusted text only); without it they are ordinary "
                "text, as user content always is. No effect with --decode");
  sub->add_flag("--decode", opts->decode,
                "Read a JSON array of token ids instead of text and print the decoded bytes "
                "exactly, nothing added (special ids print as their names)");
  auto* text = sub->add_option("--text", opts->text,
                               "The input given on the command line (text, or a JSON id list "
                               "with --decode); may be empty");
  auto* file = sub->add_option("--file", opts->file,
                               "Read the input from this file, byte for byte ('-' reads stdin)");
  auto* image = sub->add_option(
      "--image", opts->images,
      "An image (repeatable; the model folder needs a vision tower): its segment "
      "<|media_begin|>image WxH<|media_content|> N×<|media_pad|> <|media_end|> goes at the "
      "text's <|kimi_image_placeholder|>s in order, or before the text; prints one JSON object "
      "{\"ids\": [...], \"images\": [...]} with each image's token spans");
  text->excludes(file);
  image->excludes("--decode");
  sub->callback([opts, text, file] { run_tokenize(*opts, text->count() > 0, file->count() > 0); });
}

}  // namespace deltafin::cli
