// The K3 processor's preprocessing of one image (docs/VISION.md §2.3, §3.2–3.7), exactly: the
// media_proc_cfg of preprocessor_config.json, the resize rule in IEEE doubles (plan_image), the
// Pillow resize (resize.h), compositing onto the configured background in float32, zero padding,
// the normalisation table and the patch layout — so the pixel tensor equals the reference
// processor's bit for bit (tests/vision_preprocess_test.cpp checks it on every test image).
//
// `plan_image` needs only the decoded width and height, which `probe_image` reads from the
// headers: the token count of an image is known before anything is decoded or computed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vision/image.h"

namespace deltafin::vision {

// transparent_bg_config (§2.3); absent keys take the reference dataclass's defaults.
struct TransparentBackground {
  enum class Pattern { kWhite, kBlack, kGray, kChessboard };
  Pattern pattern = Pattern::kBlack;
  int64_t square_size = 16;
  bool square_on_top_left = true;
  int white_value = 255;
  int gray_value = 200;
};

// preprocessor_config.json's media_proc_cfg, validated (§2.3).
struct MediaProcConfig {
  int64_t patch_size = 14;
  int64_t merge_kernel_size = 2;
  int64_t in_patch_limit = 65536;
  int64_t patch_limit_on_one_side = 512;
  double image_mean[3] = {0.5, 0.5, 0.5};
  double image_std[3] = {0.5, 0.5, 0.5};
  // null in the file: drop alpha (Pillow's convert("RGB")).
  std::optional<TransparentBackground> background;
  bool fill_after_resize = true;  // transparent_bg_fill_stage (after_resize in the release)
};

// The released media_proc_cfg (chessboard 8 px, white 255, gray 180, after the resize).
MediaProcConfig release_media_proc_config();
// Parses preprocessor_config.json text (an object with a media_proc_cfg member). Every field of
// the image path is checked; an invalid value is an InvalidArgument naming `path` and the field.
// Video-only fields are type-checked and otherwise unused (K3's processor has no video path).
MediaProcConfig parse_media_proc_config(const std::string& json_text, const std::string& path);

// The resize rule's result for a W × H image (§3.3).
struct ImagePlan {
  int64_t width = 0, height = 0;          // decoded
  double scale = 1.0;                     // min(1, s1, s2, s3)
  int64_t new_width = 0, new_height = 0;  // after the resize
  int64_t pad_width = 0, pad_height = 0;  // zeros right / bottom
  int64_t grid_h = 0, grid_w = 0;         // patches
  int64_t num_tokens = 0;                 // merged tokens: (grid_h / m) · (grid_w / m)
  int64_t patches() const { return grid_h * grid_w; }
};
ImagePlan plan_image(int64_t width, int64_t height, const MediaProcConfig& cfg);

// An upper bound of the patches plan_image gives any image under `cfg` (what the memory planner
// sizes the tower's working memory by; docs/VISION.md §11.8 derives it): the budget L inflated by
// the rule's integer divisions, (1 + S/L)^2 with S = patch_limit_on_one_side, plus the padding of
// two sides, at most the S x S grid. The release: 67,854 (vLLM's worst case is 67,268).
int64_t max_patches(const MediaProcConfig& cfg);

// The processor's output for one image: pixel_values [frames · grid_h · grid_w, 3, p, p] as
// float32 (patch-major, frame-major; inside a patch channel, row, column) and grid_thw.
struct PixelTensor {
  int64_t frames = 1, grid_h = 0, grid_w = 0, patch = 14;
  std::vector<float> values;
  int64_t rows() const { return frames * grid_h * grid_w; }
  int64_t row_size() const { return 3 * patch * patch; }
};

struct PreprocessedImage {
  ImagePlan plan;
  PixelTensor pixels;
  std::vector<uint8_t> padded_rgb;  // the padded uint8 image [Hp][Wp][3] (kept for tests)
};

// §3.2: the RGB uint8 image the reference's fill_transparent_bg_with returns for `im`.
std::vector<uint8_t> composite_rgb(const Image& im,
                                   const std::optional<TransparentBackground>& background);
// §3.6: the normalised float32 value of uint8 `v` in channel `c`, as the reference computes it.
float normalize_value(uint8_t v, const MediaProcConfig& cfg, int c);

// The whole of §3 for one decoded image (frame 0; T = 1).
PreprocessedImage preprocess(const Image& im, const MediaProcConfig& cfg);

}  // namespace deltafin::vision
