// `deltafin logits`: exact logits for a token sequence, written as float32 little-endian
// [T, vocab] (row t = logits after tokens[0..t]). The three modes run the same sequence as one
// prefill pass, one token per pass, or a prefix pass then single-token passes; they must agree.
// With --image (K3's vision tower, docs/VISION.md §6) each image's projector rows replace the
// embedding rows of the next run of media placeholder tokens in --tokens, in order; in every mode
// a pass gets exactly the rows of its own tokens, so the modes still agree.
#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/vision_encoder.h"
#include "model/model.h"

namespace deltafin::cli {

namespace {
struct LogitsArgs {
  EngineOptions engine;
  std::string tokens;
  std::string mode = "prefill";
  std::string out;
  std::vector<std::string> images;
};

// The images' rows in placeholder order, and the rows of `ids` they replace.
struct ImageRows {
  std::vector<int64_t> rows;
  std::vector<float> values;
};

ImageRows embed_images(const LogitsArgs& a, const std::vector<int32_t>& ids, int64_t hidden) {
  ImageRows r;
  if (a.images.empty()) return r;
  const auto enc = VisionEncoder::open(a.engine.model);
  const int64_t pad = enc->config().placeholder_id;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] == pad) r.rows.push_back(static_cast<int64_t>(t));
  }
  // Headers first: a count that does not match is refused before the tower runs.
  std::vector<std::vector<uint8_t>> bytes;
  int64_t want = 0;
  for (const auto& path : a.images) {
    bytes.push_back(vision::read_image_file(path, enc->limits()));
    want += enc->plan(bytes.back(), path).num_tokens;
  }
  if (want != static_cast<int64_t>(r.rows.size())) {
    fail_arg(
        "--image: the {} image(s) take {} media placeholder tokens (id {}), but --tokens holds {}",
        a.images.size(), want, pad, r.rows.size());
  }
  if (enc->config().text_hidden != hidden) {
    fail_arg("--image: the vision tower's rows are {} wide, the text model's {}",
             enc->config().text_hidden, hidden);
  }
  for (size_t i = 0; i < a.images.size(); ++i) {
    const ImageEmbedding e = enc->encode(bytes[i], a.images[i]);
    r.values.insert(r.values.end(), e.rows.begin(), e.rows.end());
  }
  return r;
}

// One pass over tokens [b, e) with the image rows that fall in it.
std::vector<float> pass(Model& model, State& state, std::span<const int32_t> ids, size_t b,
                        size_t e, const ImageRows& img, int64_t hidden) {
  const auto lo = std::lower_bound(img.rows.begin(), img.rows.end(), static_cast<int64_t>(b));
  const auto hi = std::lower_bound(img.rows.begin(), img.rows.end(), static_cast<int64_t>(e));
  std::vector<int64_t> rows;
  for (auto it = lo; it != hi; ++it) rows.push_back(*it - static_cast<int64_t>(b));
  const size_t first = static_cast<size_t>(lo - img.rows.begin());
  SequenceInput in;
  in.state = &state;
  in.tokens = ids.subspan(b, e - b);
  in.all_logits = true;
  in.embed_rows = rows;
  in.embed_values =
      std::span<const float>(img.values)
          .subspan(first * static_cast<size_t>(hidden), rows.size() * static_cast<size_t>(hidden));
  return model.forward(std::span<SequenceInput>(&in, 1));
}

void run_logits(LogitsArgs& a) {
  auto ids = parse_id_list(a.tokens, "--tokens");
  check_output_target(a.out);  // before the model loads
  a.engine.model = resolve_model_dir(a.engine.model);
  int64_t split = -1;
  if (a.mode == "prefill") {
    split = static_cast<int64_t>(ids.size());
  } else if (a.mode == "decode") {
    split = 0;
  } else if (a.mode.rfind("split:", 0) == 0) {
    try {
      size_t used = 0;
      split = std::stoll(a.mode.substr(6), &used);
      if (used != a.mode.size() - 6) split = -1;
    } catch (...) {
      split = -1;
    }
    if (split < 0 || split > static_cast<int64_t>(ids.size())) {
      fail_arg("--mode {}: N must be an integer in 0..{} (the number of tokens)", a.mode,
               ids.size());
    }
  } else {
    fail_arg("--mode {}: expected prefill, decode or split:N", a.mode);
  }
  auto model = load_model(a.engine);
  State state = model->new_state();
  const int64_t hidden = model->config().hidden;
  const ImageRows img = embed_images(a, ids, hidden);
  std::vector<float> all;
  std::span<const int32_t> span(ids);
  if (split > 0) all = pass(*model, state, span, 0, static_cast<size_t>(split), img, hidden);
  for (size_t t = static_cast<size_t>(split); t < ids.size(); ++t) {
    auto row = pass(*model, state, span, t, t + 1, img, hidden);
    all.insert(all.end(), row.begin(), row.end());
  }
  write_file_atomic(a.out, std::string_view(reinterpret_cast<const char*>(all.data()),
                                            all.size() * sizeof(float)));
}
}  // namespace

void register_logits(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  auto* cmd = app.add_subcommand("logits",
                                 "Write exact logits [T, vocab] (float32 LE) for a token sequence");
  add_engine_options(cmd, args->engine);
  cmd->add_option("--tokens", args->tokens, "Token ids, e.g. 5,17,200")->required();
  cmd->add_option(
         "--mode", args->mode,
         "prefill (one pass), decode (one token per pass) or split:N (prefill N, then decode)")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Output file")->required();
  cmd->add_option("--image", args->images,
                  "An image (PNG, JPEG, GIF, WebP) whose vision-tower rows replace the next run of "
                  "media placeholder ids in --tokens (repeatable, in order)");
  cmd->callback([args] { run_logits(*args); });
}

}  // namespace deltafin::cli
