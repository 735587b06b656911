// The image layer (src/vision) against the reference processor: every test image — the main set
// of tests/data/vision and the decoder variants of tests/data/vision/decode — decodes to Pillow's
// mode, size and RGB pixels, and preprocesses to the reference's pixel tensor bit for bit
// (SHA-256 of the float32 tensor and of the padded uint8 image, sampled values, the plan), as
// tools/vision/make_engine_goldens.py recorded them with Pillow. Hostile files each give one
// InvalidArgument naming the file and what was expected; the resize rule matches the doc's
// examples; the media_proc_cfg parser names the field at fault.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/resize.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string sha256_hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  const std::string s = test::slurp(path);
  return {s.begin(), s.end()};
}

std::string vision_dir() {
  return test::data_dir() + "/vision";
}

const json& goldens() {
  static const json j = json::parse(test::slurp(vision_dir() + "/preprocess.json"));
  return j;
}

std::vector<std::string> golden_images() {
  std::vector<std::string> names;
  for (auto it = goldens()["images"].begin(); it != goldens()["images"].end(); ++it)
    names.push_back(it.key());
  return names;
}

class VisionPreprocess : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionPreprocess, PixelTensorEqualsTheReferenceBitForBit) {
  const std::string name = GetParam();
  const json& g = goldens()["images"][name];
  const auto bytes = bytes_of(vision_dir() + "/" + name);
  const vision::Image im = vision::decode_image(bytes, name);
  EXPECT_EQ(vision::mode_name(im.mode), g["mode"].get<std::string>());
  EXPECT_EQ(im.width, g["width"].get<int64_t>());
  EXPECT_EQ(im.height, g["height"].get<int64_t>());
  EXPECT_EQ(im.transparency.present(), g["transparency"].get<bool>());
  const auto rgb = vision::to_rgb(im);
  EXPECT_EQ(sha256_hex(rgb.data(), rgb.size()), g["rgb_sha256"]) << "Pillow's convert(\"RGB\")";

  const vision::ImageInfo info = vision::probe_image(bytes, name);
  EXPECT_EQ(info.width, im.width);
  EXPECT_EQ(info.height, im.height);
  EXPECT_EQ(info.mode, im.mode);

  const auto cfg = vision::release_media_proc_config();
  const vision::PreprocessedImage p = vision::preprocess(im, cfg);
  EXPECT_EQ(p.plan.new_width, g["resized"][0].get<int64_t>());
  EXPECT_EQ(p.plan.new_height, g["resized"][1].get<int64_t>());
  EXPECT_EQ(p.plan.grid_h, g["grid_thw"][1].get<int64_t>());
  EXPECT_EQ(p.plan.grid_w, g["grid_thw"][2].get<int64_t>());
  EXPECT_EQ(p.plan.num_tokens, g["num_tokens"].get<int64_t>());
  EXPECT_EQ(p.pixels.rows(), p.plan.patches());
  EXPECT_EQ(sha256_hex(p.padded_rgb.data(), p.padded_rgb.size()), g["padded_u8_sha256"])
      << "the padded uint8 image differs from the reference's";
  const auto& v = p.pixels.values;
  EXPECT_EQ(sha256_hex(v.data(), v.size() * sizeof(float)), g["pixel_values_sha256"])
      << "the pixel tensor differs from the reference's";
  for (const auto& s : g["samples"]) {
    const size_t i = s[0].get<size_t>();
    ASSERT_LT(i, v.size());
    EXPECT_EQ(v[i], static_cast<float>(s[1].get<double>())) << "pixel_values[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Images, VisionPreprocess, ::testing::ValuesIn(golden_images()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return s;
                         });

// Every hostile file: one InvalidArgument whose message names the file and says what is wrong.
TEST(VisionDecode, HostileImagesGiveOneClearError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hostile_truncated.png", "truncated"},
      {"hostile_empty.png", "empty file"},
      {"hostile_zero_width.png", "positive width and height"},
      {"hostile_bomb.png", "over the limit of 178956970 pixels"},
      {"hostile_not_image.png", "not a recognised image"},
      {"hostile_garbage.jpg", "not a valid JPEG"},
      {"decode/cmyk.jpg", "CMYK"},
      {"decode/gray16.png", "16-bit greyscale"},
      {"decode/truncated.jpg", "truncated"},
      {"decode/bomb.gif", "30000x30000"},
      {"decode/bomb_frame.gif", "over the limit"},
      {"decode/jpeg_huge.jpg", "60000x60000"},
      {"decode/image.bmp", "BMP"},
      {"decode/truncated.webp", "WebP"},
      {"decode/webp_garbage.webp", "WebP"},
      {"decode/bad_chunk.png", "PNG"},
      {"decode/bad_idat.png", "PNG image data"},
      {"decode/gif_no_image.gif", "no image"},
  };
  for (const auto& [file, expected] : cases) {
    SCOPED_TRACE(file);
    const auto bytes = bytes_of(vision_dir() + "/" + file);
    try {
      vision::decode_image(bytes, file);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(file + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(expected), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    // The header probe refuses what the headers decide, with the same kind of error; a broken
    // stream behind good headers is the decoder's to find.
    try {
      vision::probe_image(bytes, file);
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind(file + ": ", 0), 0u) << e.what();
    }
  }
  // Every hostile file the golden generator made is covered above.
  for (auto it = goldens()["hostile"].begin(); it != goldens()["hostile"].end(); ++it) {
    const std::string f = "decode/" + it.key();
    EXPECT_TRUE(
        std::any_of(cases.begin(), cases.end(), [&](const auto& c) { return c.first == f; }))
        << f << " has no refusal test";
  }
}

// The limits are the caller's: a smaller pixel or byte budget refuses before decoding.
TEST(VisionDecode, LimitsAreCheckedBeforeDecoding) {
  const auto bytes = bytes_of(vision_dir() + "/photo.jpg");
  vision::ImageLimits small;
  small.max_pixels = 640 * 427 - 1;
  EXPECT_THROW(vision::decode_image(bytes, "photo.jpg", small), InvalidArgument);
  small = {};
  small.max_bytes = bytes.size() - 1;
  try {
    vision::probe_image(bytes, "photo.jpg", small);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("byte image limit"), std::string::npos) << e.what();
  }
}

// The format comes from the bytes: a JPEG named .png is a JPEG, a PNG named .jpg a PNG.
TEST(VisionDecode, FormatComesFromTheBytesNotTheName) {
  const auto jpeg = bytes_of(vision_dir() + "/photo.jpg");
  EXPECT_EQ(vision::probe_image(jpeg, "claims.png").format, vision::ImageFormat::kJpeg);
  const auto png = bytes_of(vision_dir() + "/tiny_20x9.png");
  EXPECT_EQ(vision::decode_image(png, "claims.jpg").width, 20);
  EXPECT_EQ(vision::sniff_format(png, "x.webp"), vision::ImageFormat::kPng);
}

// docs/VISION.md §3.3's table, and its double-precision example.
TEST(VisionPlan, ResizeRuleMatchesTheDocExamples) {
  const auto cfg = vision::release_media_proc_config();
  struct Row {
    int64_t w, h, rw, rh, gh, gw, tokens;
  };
  const Row rows[] = {
      {896, 896, 896, 896, 64, 64, 1024},        {1024, 768, 1024, 768, 56, 74, 1036},
      {1920, 1080, 1920, 1080, 78, 138, 2691},   {4000, 3000, 4000, 3000, 216, 286, 15444},
      {8000, 8000, 3586, 3586, 258, 258, 16641}, {1861, 7041, 1850, 7002, 502, 134, 16817},
      {10000, 100, 7168, 71, 6, 512, 768},       {20, 9, 20, 9, 2, 2, 1},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(fmt::format("{}x{}", r.w, r.h));
    const vision::ImagePlan p = vision::plan_image(r.w, r.h, cfg);
    EXPECT_EQ(p.new_width, r.rw);
    EXPECT_EQ(p.new_height, r.rh);
    EXPECT_EQ(p.grid_h, r.gh);
    EXPECT_EQ(p.grid_w, r.gw);
    EXPECT_EQ(p.num_tokens, r.tokens);
  }
  EXPECT_EQ(vision::plan_image(100000, 1, cfg).new_width, 7167);  // 100000 · (7168/100000)
  EXPECT_THROW(vision::plan_image(0, 5, cfg), InvalidArgument);
}

// §3.6: v = 0 → −1, 255 → +1, 1 → −0.99215686 (float32 of the double computation).
TEST(VisionPlan, NormalisationIsTheReferenceFloat32Table) {
  const auto cfg = vision::release_media_proc_config();
  EXPECT_EQ(vision::normalize_value(0, cfg, 0), -1.0f);
  EXPECT_EQ(vision::normalize_value(255, cfg, 1), 1.0f);
  EXPECT_EQ(vision::normalize_value(1, cfg, 2), -0.99215686f);
  for (int v = 0; v < 256; ++v) {
    const float ref = (static_cast<float>(v / 255.0) - 0.5f) * 2.0f;  // the doc's equivalence
    EXPECT_EQ(vision::normalize_value(static_cast<uint8_t>(v), cfg, 0), ref) << v;
  }
}

// §3.2's worked example: alpha 128 over white 255 with value 40 gives 147, over gray 180 109.
TEST(VisionPlan, CompositingIsTheReferenceFloat32Blend) {
  vision::Image im;
  im.mode = vision::PixelMode::kRGBA;
  im.width = 9;
  im.height = 1;
  for (int x = 0; x < 9; ++x) im.pixels.insert(im.pixels.end(), {40, 40, 40, 128});
  const auto rgb = vision::composite_rgb(im, vision::release_media_proc_config().background);
  EXPECT_EQ(rgb[0], 147);      // x = 0: the top-left square is white
  EXPECT_EQ(rgb[8 * 3], 109);  // x = 8: the next square is gray
}

TEST(VisionConfigFiles, MediaProcConfigErrorsNameTheField) {
  const std::string good =
      test::slurp(test::data_dir() + "/k3-tiny-vision/model/preprocessor_config.json");
  const auto cfg = vision::parse_media_proc_config(good, "pre.json");
  EXPECT_EQ(cfg.in_patch_limit, 65536);
  ASSERT_TRUE(cfg.background.has_value());
  EXPECT_EQ(cfg.background->square_size, 8);
  EXPECT_EQ(cfg.background->gray_value, 180);
  EXPECT_TRUE(cfg.fill_after_resize);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"patch_size": 0})", "media_proc_cfg.patch_size"},
      {R"({"image_std": [0.5, 0, 0.5]})", "media_proc_cfg.image_std"},
      {R"({"image_mean": [0.5, 0.5]})", "media_proc_cfg.image_mean"},
      {R"({"fixed_output_tokens": 64})", "fixed_output_tokens"},
      {R"({"merge_kernel_size": [2, 3]})", "merge_kernel_size"},
      {R"({"transparent_bg_fill_stage": "later"})", "transparent_bg_fill_stage"},
      {R"({"transparent_bg_config": {"pattern": "plaid"}})", "transparent_bg_config.pattern"},
      {R"({"transparent_bg_config": {"colour": 3}})", "transparent_bg_config.colour"},
      {R"({"in_patch_limit": "many"})", "in_patch_limit"},
  };
  for (const auto& [patch, field] : bad) {
    SCOPED_TRACE(patch);
    json doc = json::parse(good);
    doc["media_proc_cfg"].merge_patch(json::parse(patch));
    try {
      vision::parse_media_proc_config(doc.dump(), "pre.json");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("pre.json: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(vision::parse_media_proc_config("{}", "pre.json"), InvalidArgument);
  EXPECT_THROW(vision::parse_media_proc_config("not json", "pre.json"), InvalidArgument);
}

// Pillow's taps: a 2:1 downscale widens the kernel (support 4, 9 taps) and each weight row sums
// to 2^22 within rounding.
TEST(VisionPlan, BicubicTapsAreNormalisedFixedPoint) {
  const vision::ResampleTaps t = vision::bicubic_taps(100, 50);
  EXPECT_EQ(t.ksize, 9);
  for (int64_t o = 0; o < 50; ++o) {
    int64_t sum = 0;
    for (int64_t i = 0; i < t.count[o]; ++i) sum += t.weights[o * t.ksize + i];
    EXPECT_NEAR(sum, 1 << 22, 8) << o;
  }
}

}  // namespace
}  // namespace deltafin
