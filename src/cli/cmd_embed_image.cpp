// `deltafin embed-image --model DIR --image FILE --out F`: K3's vision tower and projector over
// one image (docs/VISION.md): the rows that replace the image's <|media_pad|> tokens in a
// prompt, written as float32 little-endian [tokens, hidden]. It prints the row count and the
// patch grid, so the command is also how an image's token count and the whole vision path are
// checked from the command line (tests/vision_tower_test.cpp runs it against the float64
// reference's goldens).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/vision_encoder.h"

namespace deltafin::cli {

namespace {

struct EmbedImageArgs {
  std::string model, image, out;
  int threads = 0;
  std::string kernels;
  bool json = false;
  bool count_only = false;
};

void run_embed_image(const EmbedImageArgs& a) {
  if (a.model.empty()) fail_usage("--model DIR is required (a K3 checkpoint with a vision tower)");
  if (!a.count_only && a.out.empty()) fail_usage("--out FILE is required (or --count-only)");
  if (!a.out.empty()) check_output_target(a.out);  // before anything slow
  EngineOptions e;
  e.threads = a.threads;
  e.kernels = a.kernels;
  apply_engine_options(e);
  require_model_folder(a.model);
  const auto enc = VisionEncoder::open(a.model);
  const std::vector<uint8_t> bytes = vision::read_image_file(a.image, enc->limits());
  ImageEmbedding emb;
  if (a.count_only) {
    emb.plan = enc->plan(bytes, a.image, &emb.info);
    emb.tokens = emb.plan.num_tokens;
    emb.hidden = enc->config().text_hidden;
  } else {
    emb = enc->encode(bytes, a.image);
    write_file_atomic(a.out, std::string_view(reinterpret_cast<const char*>(emb.rows.data()),
                                              emb.rows.size() * sizeof(float)));
  }
  const auto& p = emb.plan;
  if (a.json) {
    nlohmann::ordered_json j;
    j["image"] = a.image;
    j["format"] = vision::format_name(emb.info.format);
    j["mode"] = vision::mode_name(emb.info.mode);
    j["width"] = p.width;
    j["height"] = p.height;
    j["resized"] = {p.new_width, p.new_height};
    j["padded"] = {p.new_width + p.pad_width, p.new_height + p.pad_height};
    j["grid_thw"] = {1, p.grid_h, p.grid_w};
    j["tokens"] = emb.tokens;
    j["hidden"] = emb.hidden;
    if (!a.count_only) {
      j["out"] = a.out;
      j["preprocess_seconds"] = emb.preprocess_seconds;
      j["tower_seconds"] = emb.tower_seconds;
    }
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{} rows of {} (grid 1x{}x{}; image {}x{} {} {}, resized to {}x{}){}\n", emb.tokens,
               emb.hidden, p.grid_h, p.grid_w, p.width, p.height,
               vision::format_name(emb.info.format), vision::mode_name(emb.info.mode), p.new_width,
               p.new_height,
               a.count_only ? std::string()
                            : fmt::format(" -> {} (preprocessing {:.3f} s, tower {:.3f} s)", a.out,
                                          emb.preprocess_seconds, emb.tower_seconds));
  }
}

}  // namespace

void register_embed_image(CLI::App& app) {
  auto a = std::make_shared<EmbedImageArgs>();
  auto* cmd = app.add_subcommand(
      "embed-image",
      "Run K3's vision tower on one image: write the projector's rows (float32 LE [tokens, "
      "hidden])");
  cmd->add_option("--model", a->model, "Checkpoint folder with a vision tower")->required();
  cmd->add_option("--image", a->image, "PNG, JPEG, GIF (frame 0) or WebP file")->required();
  cmd->add_option("--out", a->out, "Output file for the rows");
  cmd->add_flag("--count-only", a->count_only,
                "Read only the image's headers and print its token count (no tower, no --out)");
  cmd->add_flag("--json", a->json, "Print one JSON object (size, grid, tokens) instead of a line");
  cmd->add_option("--threads", a->threads, "Compute threads (default: one per physical core)")
      ->check(non_negative());
  cmd->add_option("--kernels", a->kernels,
                  "Force a kernel set: scalar, avx2, avx512 or neon (default: best for this CPU)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "neon"}));
  cmd->callback([a] { run_embed_image(*a); });
}

}  // namespace deltafin::cli
