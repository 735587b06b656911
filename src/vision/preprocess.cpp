// The K3 processor's steps (preprocess.h), each as docs/VISION.md §3 states it. Arithmetic that
// must match the reference bit for bit is written in the reference's precision and order: the
// resize rule in doubles, compositing in float32 (two products and a sum, truncated), the
// normalisation as float32(v / 255.0) then double-precision mean and 1/std rounded to float32.
// This folder is compiled with -ffp-contract=off, so none of it is fused into multiply-adds.
#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"
#include "vision/resize.h"

namespace deltafin::vision {

using nlohmann::json;

MediaProcConfig release_media_proc_config() {
  MediaProcConfig c;
  TransparentBackground bg;
  bg.pattern = TransparentBackground::Pattern::kChessboard;
  bg.square_size = 8;
  bg.square_on_top_left = true;
  bg.white_value = 255;
  bg.gray_value = 180;
  c.background = bg;
  c.fill_after_resize = true;
  return c;
}

namespace {

// Reads media_proc_cfg fields with errors naming the file and the field.
class CfgReader {
 public:
  CfgReader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  [[noreturn]] void bad(const std::string& field, const std::string& expected,
                        const json* found) const {
    fail_arg("{}: media_proc_cfg.{}: expected {}, found {}", where_, field, expected,
             found == nullptr ? std::string("nothing") : found->dump().substr(0, 80));
  }
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  int64_t integer(const json* v, const std::string& field, int64_t lo, int64_t hi) const {
    const std::string want = fmt::format("an integer from {} to {}", lo, hi);
    if (v == nullptr || !v->is_number_integer()) bad(field, want, v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      bad(field, want, v);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) bad(field, want, v);
    return x;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    return integer(find(key), key, lo, hi);
  }
  void triple(const std::string& key, double out[3], bool positive) const {
    const json* v = find(key);
    const char* want = positive ? "a list of 3 positive numbers" : "a list of 3 numbers";
    if (v == nullptr || !v->is_array() || v->size() != 3) bad(key, want, v);
    for (size_t i = 0; i < 3; ++i) {
      const json& e = (*v)[i];
      if (!e.is_number()) bad(key, want, v);
      out[i] = e.get<double>();
      if (!std::isfinite(out[i]) || (positive && !(out[i] > 0))) bad(key, want, v);
    }
  }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
};

TransparentBackground parse_background(const json& bg, const std::string& where) {
  static const char* kKeys[] = {"pattern", "chessboard_square_size",
                                "chessboard_square_on_top_left", "chessboard_white_value",
                                "chessboard_gray_value"};
  for (auto it = bg.begin(); it != bg.end(); ++it) {
    if (std::find_if(std::begin(kKeys), std::end(kKeys),
                     [&](const char* k) { return it.key() == k; }) == std::end(kKeys)) {
      fail_arg(
          "{}: media_proc_cfg.transparent_bg_config.{}: unknown key (expected pattern, "
          "chessboard_square_size, chessboard_square_on_top_left, chessboard_white_value, "
          "chessboard_gray_value)",
          where, it.key());
    }
  }
  CfgReader r(bg, where);
  TransparentBackground out;
  if (const json* p = r.find("pattern")) {
    const std::string want = "\"white\", \"black\", \"gray\" or \"chessboard\"";
    if (!p->is_string()) r.bad("transparent_bg_config.pattern", want, p);
    const std::string s = p->get<std::string>();
    if (s == "white")
      out.pattern = TransparentBackground::Pattern::kWhite;
    else if (s == "black")
      out.pattern = TransparentBackground::Pattern::kBlack;
    else if (s == "gray")
      out.pattern = TransparentBackground::Pattern::kGray;
    else if (s == "chessboard")
      out.pattern = TransparentBackground::Pattern::kChessboard;
    else
      r.bad("transparent_bg_config.pattern", want, p);
  }
  if (const json* v = r.find("chessboard_square_size"))
    out.square_size = r.integer(v, "transparent_bg_config.chessboard_square_size", 1, 4096);
  if (const json* v = r.find("chessboard_white_value"))
    out.white_value =
        static_cast<int>(r.integer(v, "transparent_bg_config.chessboard_white_value", 0, 255));
  if (const json* v = r.find("chessboard_gray_value"))
    out.gray_value =
        static_cast<int>(r.integer(v, "transparent_bg_config.chessboard_gray_value", 0, 255));
  if (const json* v = r.find("chessboard_square_on_top_left")) {
    if (!v->is_boolean())
      r.bad("transparent_bg_config.chessboard_square_on_top_left", "true or false", v);
    out.square_on_top_left = v->get<bool>();
  }
  return out;
}

}  // namespace

MediaProcConfig parse_media_proc_config(const std::string& json_text, const std::string& path) {
  const json root = parse_json(json_text, path);
  if (!root.is_object() || !root.contains("media_proc_cfg"))
    fail_arg("{}: expected an object with a media_proc_cfg member", path);
  const json& m = root["media_proc_cfg"];
  if (!m.is_object()) fail_arg("{}: media_proc_cfg: expected an object", path);
  CfgReader r(m, path);
  MediaProcConfig c;
  c.patch_size = r.integer("patch_size", 1, 64);
  if (const json* mk = r.find("merge_kernel_size"); mk != nullptr && mk->is_array()) {
    if (mk->size() != 2 || (*mk)[0] != (*mk)[1])
      r.bad("merge_kernel_size", "an integer or [k, k] from 1 to 8", mk);
    c.merge_kernel_size = r.integer(&(*mk)[0], "merge_kernel_size", 1, 8);
  } else {
    c.merge_kernel_size = r.integer(mk, "merge_kernel_size", 1, 8);
  }
  c.in_patch_limit = r.integer("in_patch_limit", 1, int64_t{1} << 22);
  c.patch_limit_on_one_side = r.integer("patch_limit_on_one_side", 1, 4096);
  if (const json* f = r.find("fixed_output_tokens"); f != nullptr && !f->is_null())
    r.bad("fixed_output_tokens", "null (the release value; a forced token count is not supported)",
          f);
  r.triple("image_mean", c.image_mean, false);
  r.triple("image_std", c.image_std, true);
  c.fill_after_resize = false;  // the reference dataclass's default: before_resize
  if (const json* st = r.find("transparent_bg_fill_stage"); st != nullptr && !st->is_null()) {
    const std::string want = "\"before_resize\" or \"after_resize\"";
    if (!st->is_string()) r.bad("transparent_bg_fill_stage", want, st);
    const std::string s = st->get<std::string>();
    if (s == "after_resize")
      c.fill_after_resize = true;
    else if (s != "before_resize")
      r.bad("transparent_bg_fill_stage", want, st);
  }
  if (const json* bg = r.find("transparent_bg_config"); bg != nullptr && !bg->is_null()) {
    if (!bg->is_object()) r.bad("transparent_bg_config", "an object or null", bg);
    c.background = parse_background(*bg, path);
  }
  // Video-only fields (§2.3): type-checked, unused (K3's processor makes T = 1 inputs only).
  if (const json* v = r.find("in_patch_limit_each_frame"); v != nullptr && !v->is_null())
    r.integer(v, "in_patch_limit_each_frame", 1, int64_t{1} << 22);
  if (const json* v = r.find("temporal_merge_kernel_size"); v != nullptr && !v->is_null())
    r.integer(v, "temporal_merge_kernel_size", 1, 64);
  if (const json* v = r.find("sample_fps");
      v != nullptr && !v->is_null() && (!v->is_number() || !(v->get<double>() > 0)))
    r.bad("sample_fps", "a positive number", v);
  if (const json* v = r.find("config_type"); v != nullptr && !v->is_null() && !v->is_string())
    r.bad("config_type", "a string", v);
  return c;
}

ImagePlan plan_image(int64_t width, int64_t height, const MediaProcConfig& cfg) {
  if (width <= 0 || height <= 0)
    fail_arg("image of {}x{}: expected a positive size", width, height);
  const int64_t p = cfg.patch_size, m = cfg.merge_kernel_size, side = cfg.patch_limit_on_one_side;
  ImagePlan pl;
  pl.width = width;
  pl.height = height;
  const double denom = std::max(1.0, static_cast<double>(width / p)) *
                       std::max(1.0, static_cast<double>(height / p));
  const double s1 = std::sqrt(static_cast<double>(cfg.in_patch_limit) / denom);
  const double s2 = static_cast<double>(side * p) / static_cast<double>(width);
  const double s3 = static_cast<double>(side * p) / static_cast<double>(height);
  pl.scale = std::min({1.0, s1, s2, s3});
  auto scaled = [&](int64_t v) {
    const double x = static_cast<double>(v) * pl.scale;  // trunc toward zero (Python int())
    return std::min(std::max<int64_t>(1, static_cast<int64_t>(x)), side * p);
  };
  pl.new_width = scaled(width);
  pl.new_height = scaled(height);
  const int64_t f = m * p;
  pl.pad_width = (f - pl.new_width % f) % f;
  pl.pad_height = (f - pl.new_height % f) % f;
  const int64_t tok_h = (pl.new_height + pl.pad_height) / f;
  const int64_t tok_w = (pl.new_width + pl.pad_width) / f;
  if (tok_h * m > side || tok_w * m > side) {
    fail_arg("image of {}x{}: the resize rule left {}x{} patches, over patch_limit_on_one_side {}",
             width, height, tok_h * m, tok_w * m, side);
  }
  pl.grid_h = (pl.new_height + pl.pad_height) / p;
  pl.grid_w = (pl.new_width + pl.pad_width) / p;
  pl.num_tokens = tok_h * tok_w;
  return pl;
}

int64_t max_patches(const MediaProcConfig& cfg) {
  const double L = static_cast<double>(cfg.in_patch_limit);
  const double S = static_cast<double>(cfg.patch_limit_on_one_side);
  const double M = static_cast<double>(cfg.merge_kernel_size);
  // Resized by the budget, both sides hold at least L / S patches, so the divisions inflate the
  // product by at most (1 + S / L)^2; padding adds under M patches to each side.
  const double inflate = 1.0 + S / L;
  const double before = L * inflate * inflate;
  const double bound = before + M * (S + std::ceil(before / S)) + M * M;
  const double grid = S * S;
  return static_cast<int64_t>(std::ceil(std::min(bound, grid)));
}

std::vector<uint8_t> composite_rgb(const Image& im,
                                   const std::optional<TransparentBackground>& background) {
  const bool has_alpha =
      im.mode == PixelMode::kLA || im.mode == PixelMode::kRGBA || im.transparency.present();
  if (!background || im.mode == PixelMode::kRGB || !has_alpha) return to_rgb(im);
  const std::vector<uint8_t> rgba = to_rgba(im);
  const TransparentBackground& bg = *background;
  int flat = 0;
  switch (bg.pattern) {
    case TransparentBackground::Pattern::kWhite:
      flat = 255;
      break;
    case TransparentBackground::Pattern::kBlack:
      flat = 0;
      break;
    case TransparentBackground::Pattern::kGray:
      flat = 128;
      break;
    case TransparentBackground::Pattern::kChessboard:
      break;
  }
  const bool board = bg.pattern == TransparentBackground::Pattern::kChessboard;
  const int64_t gray_parity = bg.square_on_top_left ? 1 : 0;
  std::vector<uint8_t> out(static_cast<size_t>(im.width * im.height * 3));
  for (int64_t y = 0; y < im.height; ++y) {
    for (int64_t x = 0; x < im.width; ++x) {
      const size_t i = static_cast<size_t>(y * im.width + x);
      int back = flat;
      if (board) {
        back = ((y / bg.square_size + x / bg.square_size) % 2 == gray_parity) ? bg.gray_value
                                                                              : bg.white_value;
      }
      const float a = static_cast<float>(rgba[4 * i + 3]) / 255.0f;
      const float b = static_cast<float>(back);
      for (int c = 0; c < 3; ++c) {
        const float v = a * static_cast<float>(rgba[4 * i + c]) + (1.0f - a) * b;
        out[3 * i + c] = static_cast<uint8_t>(v);  // toward zero; v is in [0, 255]
      }
    }
  }
  return out;
}

float normalize_value(uint8_t v, const MediaProcConfig& cfg, int c) {
  float x = static_cast<float>(static_cast<double>(v) / 255.0);
  x = static_cast<float>(static_cast<double>(x) - cfg.image_mean[c]);
  x = static_cast<float>(static_cast<double>(x) * (1.0 / cfg.image_std[c]));
  return x;
}

PreprocessedImage preprocess(const Image& im, const MediaProcConfig& cfg) {
  PreprocessedImage out;
  out.plan = plan_image(im.width, im.height, cfg);
  const ImagePlan& pl = out.plan;
  std::vector<uint8_t> rgb;
  if (cfg.fill_after_resize) {
    rgb = composite_rgb(resize_bicubic(im, pl.new_width, pl.new_height), cfg.background);
  } else {
    Image flat;
    flat.mode = PixelMode::kRGB;
    flat.width = im.width;
    flat.height = im.height;
    flat.pixels = composite_rgb(im, cfg.background);
    rgb = resize_bicubic(flat, pl.new_width, pl.new_height).pixels;
  }
  const int64_t P = cfg.patch_size;
  const int64_t Hp = pl.new_height + pl.pad_height, Wp = pl.new_width + pl.pad_width;
  out.padded_rgb.assign(static_cast<size_t>(Hp * Wp * 3), 0);
  for (int64_t y = 0; y < pl.new_height; ++y) {
    std::copy_n(rgb.begin() + y * pl.new_width * 3, pl.new_width * 3,
                out.padded_rgb.begin() + y * Wp * 3);
  }
  rgb.clear();
  rgb.shrink_to_fit();
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) table[c][v] = normalize_value(static_cast<uint8_t>(v), cfg, c);
  }
  PixelTensor& t = out.pixels;
  t.frames = 1;
  t.grid_h = pl.grid_h;
  t.grid_w = pl.grid_w;
  t.patch = P;
  t.values.resize(static_cast<size_t>(t.rows() * t.row_size()));
  float* dst = t.values.data();
  for (int64_t r = 0; r < pl.grid_h; ++r) {
    for (int64_t col = 0; col < pl.grid_w; ++col) {
      for (int c = 0; c < 3; ++c) {
        for (int64_t y = 0; y < P; ++y) {
          const uint8_t* src = out.padded_rgb.data() + ((r * P + y) * Wp + col * P) * 3 + c;
          for (int64_t x = 0; x < P; ++x) *dst++ = table[c][src[3 * x]];
        }
      }
    }
  }
  return out;
}

}  // namespace deltafin::vision
