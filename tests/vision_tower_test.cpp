// The vision tower and projector against the float64 reference (tools/vision/k3_vision_ref.py
// through tools/vision/make_engine_goldens.py): the tiny tower of tests/data/k3-tiny-vision on
// every test image through the real binary (`deltafin embed-image`), two frames and the bicubic
// position interpolation through the library; the same bits on 1 and 2 threads; vision_config
// errors naming the field; a full checkpoint (the golden text model plus the tiny tower) whose
// text logits are unchanged and whose inventory checks the vision tensors; make-model --vision;
// images in a prompt: rows given to the model replace the placeholders' embedding rows exactly,
// and `deltafin logits --image` agrees with itself in every mode and respects the images' order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/vision_encoder.h"
#include "model/vision_config.h"
#include "storage/checkpoint.h"
#include "storage/trunk_units.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tolerance: every element within 1e-5 relative, |engine - reference| <= 1e-5 · max(1, |ref|)
// (the rows are RMS-normalised, so values are O(1); the floor keeps the rare element near zero
// from demanding more than float32 can give). Measured: at most 3.5e-6 (docs/VISION.md §11).
constexpr double kRelTolerance = 1e-5;

std::string tiny_dir() {
  return test::data_dir() + "/k3-tiny-vision";
}
std::string tiny_model() {
  return tiny_dir() + "/model";
}
const json& expected() {
  static const json j = json::parse(test::slurp(tiny_dir() + "/expected/expected.json"));
  return j;
}

std::vector<float> floats_of(const std::string& path) {
  const std::string raw = test::slurp(path);
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

// Max over the golden's rows of |got - want| / max(1, |want|).
double relative_error(const json& c, const std::vector<float>& got) {
  const int64_t hidden = c["hidden"];
  const auto rows = c["rows"].get<std::vector<int64_t>>();
  const auto want = floats_of(tiny_dir() + "/expected/" + c["file"].get<std::string>());
  EXPECT_EQ(want.size(), rows.size() * static_cast<size_t>(hidden));
  EXPECT_EQ(got.size(), static_cast<size_t>(c["tokens"].get<int64_t>() * hidden));
  if (got.size() != static_cast<size_t>(c["tokens"].get<int64_t>() * hidden)) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t k = 0; k < hidden; ++k) {
      const double w = want[i * hidden + k], g = got[rows[i] * hidden + k];
      worst = std::max(worst, std::fabs(g - w) / std::max(1.0, std::fabs(w)));
    }
  }
  return worst;
}

std::vector<std::string> image_cases() {
  std::vector<std::string> names;
  for (auto it = expected()["cases"].begin(); it != expected()["cases"].end(); ++it) {
    if (it.value().contains("image") && !it.value().contains("pos_emb_interpolation_mode"))
      names.push_back(it.key());
  }
  return names;
}

class VisionTowerGolden : public ::testing::TestWithParam<std::string> {};

// Through the binary: embed-image's rows equal the reference's within the tolerance, and it
// prints the token count and grid.
TEST_P(VisionTowerGolden, EmbedImageMatchesTheFloat64Reference) {
  const json& c = expected()["cases"][GetParam()];
  const std::string image = test::data_dir() + "/" + c["image"].get<std::string>();
  const std::string out = test::temp_dir("embed") + "/rows.f32";
  auto r = test::run_deltafin(
      {"embed-image", "--model", tiny_model(), "--image", image, "--out", out, "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto& g = c["grid_thw"];
  EXPECT_NE(
      r.out.find(fmt::format("{} rows of {} (grid 1x{}x{}", c["tokens"].get<int64_t>(),
                             c["hidden"].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>())),
      std::string::npos)
      << r.out;
  const double rel = relative_error(c, floats_of(out));
  EXPECT_LE(rel, kRelTolerance) << GetParam();
  std::printf("[ vision ] %-22s tokens %4lld  max |diff| / max(1, |ref|) = %.3g\n",
              GetParam().c_str(), static_cast<long long>(c["tokens"].get<int64_t>()), rel);
}

INSTANTIATE_TEST_SUITE_P(Images, VisionTowerGolden, ::testing::ValuesIn(image_cases()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

// The temporal path (time embedding, mean over frames) on a two-frame pixel tensor.
TEST(VisionTower, TwoFramesMatchTheReference) {
  const json& c = expected()["cases"]["two_frames"];
  const auto enc = VisionEncoder::open(tiny_model());
  vision::PixelTensor px;
  px.frames = c["grid_thw"][0];
  px.grid_h = c["grid_thw"][1];
  px.grid_w = c["grid_thw"][2];
  px.patch = 14;
  px.values = floats_of(tiny_dir() + "/expected/" + c["pixels"].get<std::string>());
  ASSERT_EQ(px.frames, 2);
  EXPECT_LE(relative_error(c, enc->encode_pixels(px)), kRelTolerance);
  px.frames = 5;  // over init_pos_emb_time
  px.values.resize(static_cast<size_t>(px.rows() * px.row_size()));
  EXPECT_THROW(enc->encode_pixels(px), InvalidArgument);
}

// A copy of the tiny tower's folder with config.json's vision_config changed by `patch`.
std::string tiny_with(const json& patch, const std::string& name) {
  const std::string dir = test::temp_dir(name) + "/model";
  fs::copy(tiny_model(), dir, fs::copy_options::recursive);
  json cfg = json::parse(test::slurp(dir + "/config.json"));
  cfg["vision_config"].merge_patch(patch);
  fs::remove(dir + "/config.json");
  test::spit(dir + "/config.json", cfg.dump(1));
  return dir;
}

// pos_emb_interpolation_mode "bicubic" switches the position grid's resize (§4.3).
TEST(VisionTower, BicubicPositionInterpolationMatchesTheReference) {
  const json& c = expected()["cases"]["photo_bicubic"];
  const auto enc =
      VisionEncoder::open(tiny_with({{"pos_emb_interpolation_mode", "bicubic"}}, "bicubic"));
  const std::string bytes = test::slurp(test::data_dir() + "/" + c["image"].get<std::string>());
  const auto emb = enc->encode(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "photo.jpg");
  EXPECT_LE(relative_error(c, emb.rows), kRelTolerance);
  // And it is a different function from bilinear on this (non-64x64) grid.
  const json& b = expected()["cases"]["photo.jpg"];
  EXPECT_GT(relative_error(b, emb.rows), 100 * kRelTolerance);
}

// Results do not depend on the thread count (kernels split outputs, never sums).
TEST(VisionTower, SameBitsOnOneAndTwoThreads) {
  const std::string bytes = test::slurp(test::data_dir() + "/vision/image.webp");
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ThreadPool one(1), two(2);
  const auto a = VisionEncoder::open(tiny_model(), &one)->encode(span, "image.webp");
  const auto b = VisionEncoder::open(tiny_model(), &two)->encode(span, "image.webp");
  ASSERT_EQ(a.rows.size(), b.rows.size());
  EXPECT_EQ(std::memcmp(a.rows.data(), b.rows.data(), a.rows.size() * 4), 0);
  // plan() from the headers alone gives the rows' count.
  vision::ImageInfo info;
  const auto plan = VisionEncoder::open(tiny_model())->plan(span, "image.webp", &info);
  EXPECT_EQ(plan.num_tokens, a.tokens);
  EXPECT_EQ(info.width, 333);
  EXPECT_EQ(info.format, vision::ImageFormat::kWebp);
}

TEST(VisionTower, VisionConfigErrorsNameTheField) {
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"activation_func", "relu"}}, "vision_config.activation_func"},
      {{{"pos_emb_interpolation_mode", "nearest"}}, "vision_config.pos_emb_interpolation_mode"},
      {{{"norm_type", "layernorm"}}, "vision_config.norm_type"},
      {{{"mm_projector_type", "patchmerger"}}, "vision_config.mm_projector_type"},
      {{{"qkv_hidden_size", 100}}, "vision_config.qkv_hidden_size"},
      {{{"vt_hidden_size", "big"}}, "vision_config.vt_hidden_size"},
      {{{"mm_hidden_size", 32}}, "vision_config.mm_hidden_size"},
      {{{"projector_ln_eps", 0}}, "vision_config.projector_ln_eps"},
      {{{"merge_kernel_size", {2}}}, "vision_config.merge_kernel_size"},
      {{{"attn_bias", "no"}}, "vision_config.attn_bias"},
      {{{"vt_num_hidden_layers", 100000}}, "vision_config.vt_num_hidden_layers"},
  };
  for (const auto& [patch, field] : bad) {
    SCOPED_TRACE(patch.dump());
    try {
      VisionEncoder::open(tiny_with(patch, "badcfg"));
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  }
  // The placeholder id sits at config.json's top level (the tiny tower's: the release's 163605).
  EXPECT_EQ(VisionEncoder::open(tiny_model())->config().placeholder_id, 163605);
  {
    json bad_id = json::parse(test::slurp(tiny_model() + "/config.json"));
    bad_id["media_placeholder_token_id"] = "pad";
    const std::string dir = test::temp_dir("badpad") + "/model";
    fs::copy(tiny_model(), dir, fs::copy_options::recursive);
    fs::remove(dir + "/config.json");
    test::spit(dir + "/config.json", bad_id.dump());
    try {
      VisionEncoder::open(dir);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("media_placeholder_token_id: expected a token id"),
                std::string::npos)
          << e.what();
    }
  }
  // Absent fields take the release defaults: with vt_num_hidden_layers gone the config says 27
  // layers, and the tensors (2 blocks) are found wanting, by name.
  json cfg = json::parse(test::slurp(tiny_model() + "/config.json"));
  cfg["vision_config"].erase("vt_num_hidden_layers");
  const std::string dir = test::temp_dir("default27") + "/model";
  fs::copy(tiny_model(), dir, fs::copy_options::recursive);
  fs::remove(dir + "/config.json");
  test::spit(dir + "/config.json", cfg.dump());
  try {
    VisionEncoder::open(dir);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("vision_config.vt_num_hidden_layers is 27 (27 when absent) but the "
                       "checkpoint holds encoder blocks for 2 layers"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("missing vision_tower.encoder.blocks.2.norm0.weight"), std::string::npos)
        << msg;
  }
}

// The tiny text model's specials sit at the release offsets from vocab - 256 (512 - 256): these
// are <|media_begin|>, <|media_content|>, <|media_end|> and <|media_pad|>.
constexpr int32_t kMediaBegin = 256 + 18, kMediaContent = 256 + 19, kMediaEnd = 256 + 20,
                  kPad = 256 + 21;

// The golden text model (tests/data/k3-tiny-bf16) with the tiny tower added, as one checkpoint.
std::string text_and_vision() {
  static const std::string dir = [] {
    const std::string d = test::temp_dir("k3-with-vision") + "/model";
    fs::create_directories(d);
    const std::string text = test::data_dir() + "/k3-tiny-bf16/model";
    json index = json::parse(test::slurp(text + "/model.safetensors.index.json"));
    const json vindex = json::parse(test::slurp(tiny_model() + "/model.safetensors.index.json"));
    for (const auto& e : fs::directory_iterator(text)) {
      if (e.path().extension() == ".safetensors")
        fs::copy(e.path(), d + "/" + e.path().filename().string());
    }
    for (auto it = vindex["weight_map"].begin(); it != vindex["weight_map"].end(); ++it) {
      const std::string shard = "vision-" + it.value().get<std::string>();
      index["weight_map"][it.key()] = shard;
      if (!fs::exists(d + "/" + shard))
        fs::copy(tiny_model() + "/" + it.value().get<std::string>(), d + "/" + shard);
    }
    test::spit(d + "/model.safetensors.index.json", index.dump(1));
    json cfg = json::parse(test::slurp(text + "/config.json"));
    cfg["vision_config"] = json::parse(test::slurp(tiny_model() + "/config.json"))["vision_config"];
    cfg["media_placeholder_token_id"] = kPad;
    test::spit(d + "/config.json", cfg.dump(1));
    fs::copy(tiny_model() + "/preprocessor_config.json", d + "/preprocessor_config.json");
    return d;
  }();
  return dir;
}

// The inventory binds and checks the tower; the text model's logits are the golden ones.
TEST(VisionCheckpoint, TextAndVisionTogether) {
  const std::string dir = text_and_vision();
  const auto ck = Checkpoint::open(dir);
  const ModelConfig c = load_config(dir);
  const InventoryReport rep = check_inventory(c, *ck);
  EXPECT_TRUE(rep.vision);
  EXPECT_EQ(rep.vision_tensors, 18u);

  const json g = json::parse(test::slurp(test::data_dir() + "/k3-tiny-bf16/case.json"));
  std::string tokens;
  for (const auto& t : g["tokens"]) {
    if (!tokens.empty()) tokens += ',';
    tokens += std::to_string(t.get<int>());
  }
  const std::string out = test::temp_dir("vision-logits") + "/logits.f32";
  auto r = test::run_deltafin({"logits", "--model", dir, "--tokens", tokens, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = floats_of(out);
  const auto want = floats_of(test::data_dir() + "/k3-tiny-bf16/logits.f32");
  ASSERT_EQ(got.size(), want.size());
  double mx = 0;
  for (size_t i = 0; i < got.size(); ++i)
    mx = std::max(mx, static_cast<double>(std::fabs(got[i] - want[i])));
  EXPECT_LT(mx, 2e-3);  // the golden tolerance of tests/golden_test.cpp

  const json& pc = expected()["cases"]["la_gray.png"];
  const std::string rows = test::temp_dir("vision-rows") + "/rows.f32";
  r = test::run_deltafin({"embed-image", "--model", dir, "--image",
                          test::data_dir() + "/vision/la_gray.png", "--out", rows});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LE(relative_error(pc, floats_of(rows)), kRelTolerance);
}

// With vision tensors present, the text loader checks them too: a missing one and a bad
// vision_config are load errors naming the tensor / field.
TEST(VisionCheckpoint, InventoryChecksTheVisionTensors) {
  const std::string dir = text_and_vision();
  const auto ck = Checkpoint::open(dir);
  ModelConfig c = load_config(dir);
  TensorTable t = ck->tensors();
  t.erase("mm_projector.post_norm.weight");
  try {
    check_inventory(c, t, dir);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mm_projector.post_norm.weight"), std::string::npos)
        << e.what();
  }
  json vc = json::parse(c.vision_config_json);
  vc["text_hidden_size"] = 7168;
  c.vision_config_json = vc.dump();
  try {
    check_inventory(c, ck->tensors(), dir);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vision_config.text_hidden_size"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("mm_projector.post_norm.weight"), std::string::npos)
        << e.what();  // listed as unexpected, in the same error
  }
}

// embed-image's errors: one line each, exit 1 (usage errors 2), nothing written.
TEST(EmbedImage, ClearErrors) {
  const std::string out = test::temp_dir("embed-errors") + "/rows.f32";
  auto r = test::run_deltafin({"embed-image", "--model", test::data_dir() + "/k3-tiny-bf16/model",
                               "--image", test::data_dir() + "/vision/photo.jpg", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds no vision tower"), std::string::npos) << r.err;
  for (const char* f : {"hostile_bomb.png", "hostile_truncated.png", "hostile_not_image.png",
                        "hostile_empty.png", "decode/cmyk.jpg"}) {
    const std::string image = test::data_dir() + "/vision/" + f;
    r = test::run_deltafin(
        {"embed-image", "--model", tiny_model(), "--image", image, "--out", out});
    EXPECT_EQ(r.exit_code, 1) << f;
    EXPECT_NE(r.err.find(image + ": "), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << f;
  }
  r = test::run_deltafin({"embed-image", "--model", tiny_model(), "--image",
                          test::data_dir() + "/vision/missing.png", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.png"), std::string::npos) << r.err;
  // A folder named as the image: refused by name, never read.
  r = test::run_deltafin({"embed-image", "--model", tiny_model(), "--image",
                          test::data_dir() + "/vision/decode", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("decode: not a regular file"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = test::run_deltafin(
      {"embed-image", "--model", tiny_model(), "--image", test::data_dir() + "/vision/photo.jpg"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
}

// --count-only reads headers only; --json gives the plan.
TEST(EmbedImage, CountOnlyAndJson) {
  auto r =
      test::run_deltafin({"embed-image", "--model", tiny_model(), "--image",
                          test::data_dir() + "/vision/wide_resized.png", "--count-only", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tokens"], 256);
  EXPECT_EQ(j["grid_thw"], json::array({1, 2, 512}));
  EXPECT_EQ(j["resized"], json::array({7168, 19}));
  EXPECT_EQ(j["width"], 15000);
  EXPECT_EQ(j["format"], "PNG");
}

// make-model --vision tiny: a text checkpoint with a tower of the released structure that the
// loader accepts and embed-image runs; its vision_config uses the release's field names.
TEST(EmbedImage, MakeModelWithAVisionTower) {
  const std::string dir = test::temp_dir("mm-vision") + "/model";
  auto r = test::run_deltafin({"make-model", dir, "--vision", "tiny", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json cfg = json::parse(test::slurp(dir + "/config.json"));
  EXPECT_EQ(cfg["media_placeholder_token_id"], 512 - 256 + 21);  // the tokenizer's <|media_pad|>
  for (const char* k : {"vt_hidden_size", "qkv_hidden_size", "pos_emb_interpolation_mode",
                        "mm_projector_type", "text_hidden_size", "projector_ln_eps"}) {
    EXPECT_TRUE(cfg["vision_config"].contains(k)) << k;
  }
  EXPECT_TRUE(fs::exists(dir + "/preprocessor_config.json"));
  const auto ck = Checkpoint::open(dir);
  EXPECT_TRUE(check_inventory(load_config(dir), *ck).vision);
  const std::string out = test::temp_dir("mm-vision-rows") + "/rows.f32";
  r = test::run_deltafin({"embed-image", "--model", dir, "--image",
                          test::data_dir() + "/vision/decode/gif_offset.gif", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("1 rows of 256 (grid 1x2x2"), std::string::npos) << r.out;
  const auto rows = floats_of(out);
  ASSERT_EQ(rows.size(), 256u);
  for (float v : rows) ASSERT_TRUE(std::isfinite(v));
  r = test::run_deltafin({"run", "--model", dir, "--prompt", "hi", "--max-new", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Kimi-Linear is a text model: no tower for it.
  r = test::run_deltafin({"make-model", test::temp_dir("mm-kl") + "/model", "--preset",
                          "kimi-linear", "--vision", "tiny", "--quiet"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--vision: Kimi-Linear is a text model"), std::string::npos) << r.err;
}

// Rows given to a pass replace those tokens' embedding rows exactly: a sequence whose rows 3..6
// are placeholders given the embedding rows of other tokens has, bit for bit, those tokens'
// logits — in one pass and across a pass boundary inside the given rows. Bad given rows are
// refused before the state is touched.
TEST(VisionPrompt, GivenRowsReplaceTheEmbeddingRowsExactly) {
  auto model = open_model(test::data_dir() + "/k3-tiny-bf16/model");
  const json g = json::parse(test::slurp(test::data_dir() + "/k3-tiny-bf16/case.json"));
  const auto text = g["tokens"].get<std::vector<int32_t>>();
  const int64_t hidden = model->config().hidden;
  std::vector<int32_t> with_pads = text;
  const std::vector<int64_t> rows = {3, 4, 5, 6};
  for (int64_t r : rows) with_pads[static_cast<size_t>(r)] = kPad;
  std::vector<float> given(rows.size() * static_cast<size_t>(hidden));
  const std::vector<int32_t> replaced(text.begin() + 3, text.begin() + 7);
  model->embed(replaced, given.data());

  State a = model->new_state();
  const auto want = model->forward(a, text, /*all_logits=*/true);
  auto run = [&](State& st, size_t b, size_t e) {
    std::vector<int64_t> r;
    size_t first = rows.size();
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] >= static_cast<int64_t>(b) && rows[i] < static_cast<int64_t>(e)) {
        first = std::min(first, i);
        r.push_back(rows[i] - static_cast<int64_t>(b));
      }
    }
    SequenceInput in;
    in.state = &st;
    in.tokens = std::span<const int32_t>(with_pads).subspan(b, e - b);
    in.all_logits = true;
    in.embed_rows = r;
    in.embed_values = std::span<const float>(given).subspan(
        std::min(first, rows.size()) * static_cast<size_t>(hidden),
        r.size() * static_cast<size_t>(hidden));
    return model->forward(std::span<SequenceInput>(&in, 1));
  };
  State b = model->new_state();
  const auto got = run(b, 0, with_pads.size());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  // Without the given rows the placeholders embed as themselves: different logits from row 3 on.
  State c = model->new_state();
  const auto plain = model->forward(c, with_pads, true);
  const size_t vocab = static_cast<size_t>(model->config().vocab);
  EXPECT_NE(std::memcmp(plain.data() + 3 * vocab, want.data() + 3 * vocab, vocab * 4), 0);
  // Split inside the given rows: the same logits as the text in the same split.
  State d = model->new_state(), e = model->new_state();
  auto split = run(d, 0, 5);
  const auto rest = run(d, 5, with_pads.size());
  split.insert(split.end(), rest.begin(), rest.end());
  auto want_split = model->forward(e, std::span<const int32_t>(text).subspan(0, 5), true);
  const auto want_rest = model->forward(e, std::span<const int32_t>(text).subspan(5), true);
  want_split.insert(want_split.end(), want_rest.begin(), want_rest.end());
  ASSERT_EQ(split.size(), want_split.size());
  EXPECT_EQ(std::memcmp(split.data(), want_split.data(), split.size() * 4), 0);

  // Refused: rows out of order, past the tokens, values of the wrong size. The state stays usable.
  State f = model->new_state();
  const std::vector<int64_t> unordered = {4, 3}, past = {40};
  for (const auto* bad : {&unordered, &past}) {
    SequenceInput in;
    in.state = &f;
    in.tokens = with_pads;
    in.embed_rows = *bad;
    in.embed_values =
        std::span<const float>(given).subspan(0, bad->size() * static_cast<size_t>(hidden));
    EXPECT_THROW(model->forward(std::span<SequenceInput>(&in, 1)), Error);
  }
  SequenceInput in;
  in.state = &f;
  in.tokens = with_pads;
  in.embed_rows = rows;
  in.embed_values = std::span<const float>(given).subspan(1);
  EXPECT_THROW(model->forward(std::span<SequenceInput>(&in, 1)), Error);
  EXPECT_EQ(f.position(), 0);
  const auto again = model->forward(f, text, true);
  EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * 4), 0);
}

// One image's prompt segment (docs/VISION.md §6) with `n` placeholders; "image WxH" is written
// with the tiny tokenizer's byte tokens (any ids: the test compares the engine with itself).
void append_segment(std::vector<int32_t>& ids, int64_t n) {
  ids.push_back(kMediaBegin);
  for (int32_t t : {105, 109, 97, 103, 101}) ids.push_back(t);
  ids.push_back(kMediaContent);
  for (int64_t i = 0; i < n; ++i) ids.push_back(kPad);
  ids.push_back(kMediaEnd);
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(t);
  }
  return s;
}

// `logits --image` with two images (la_gray.png: 4 tokens, tiny_20x9.png: 1): prefill, split
// inside the first image and decode equal the float64 reference (the reference tower's rows in
// the PyTorch text model) within the golden tolerance, and each other; without the images, or
// with their order swapped, the logits after the first placeholder differ; a count that does not
// add up, and a checkpoint without a tower, are refused with one clear error.
TEST(VisionPrompt, LogitsWithTwoImagesAgreeInEveryMode) {
  const std::string dir = text_and_vision();
  std::vector<int32_t> ids = {5, 17, 200};
  append_segment(ids, 4);
  ids.push_back(42);
  append_segment(ids, 1);
  for (int32_t t : {7, 300, 64}) ids.push_back(t);
  const std::string la = test::data_dir() + "/vision/la_gray.png";
  const std::string tiny = test::data_dir() + "/vision/tiny_20x9.png";
  const std::string tmp = test::temp_dir("vision-prompt");
  auto logits = [&](const std::string& mode, const std::vector<std::string>& images,
                    const std::string& name) {
    std::vector<std::string> args = {"logits", "--model", dir,     "--tokens",      id_list(ids),
                                     "--mode", mode,      "--out", tmp + "/" + name};
    for (const auto& im : images) {
      args.push_back("--image");
      args.push_back(im);
    }
    auto r = test::run_deltafin(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return floats_of(tmp + "/" + name);
  };
  const auto prefill = logits("prefill", {la, tiny}, "prefill.f32");
  ASSERT_EQ(prefill.size(), ids.size() * 512);
  // The reference: the float64 tower's rows in the float64 PyTorch text model
  // (tools/vision/make_prompt_golden.py), for this very prompt.
  const json meta = json::parse(test::slurp(tiny_dir() + "/expected/prompt_two_images.json"));
  ASSERT_EQ(meta["tokens"].get<std::vector<int32_t>>(), ids);
  const auto golden = floats_of(tiny_dir() + "/expected/prompt_two_images.f32");
  ASSERT_EQ(golden.size(), prefill.size());
  double vs_ref = 0;
  for (size_t i = 0; i < golden.size(); ++i)
    vs_ref = std::max(vs_ref, static_cast<double>(std::fabs(prefill[i] - golden[i])));
  EXPECT_LT(vs_ref, 2e-3);                 // the golden tolerance of tests/golden_test.cpp
  const size_t first_pad = 3 + 1 + 5 + 1;  // rows before it: text, begin, "image", content
  double worst = 0;
  for (const std::string mode : {"split:12", "decode"}) {
    const auto other = logits(mode, {la, tiny}, "other.f32");
    ASSERT_EQ(other.size(), prefill.size()) << mode;
    double mx = 0;
    for (size_t i = 0; i < other.size(); ++i)
      mx = std::max(mx, static_cast<double>(std::fabs(other[i] - prefill[i])));
    EXPECT_LT(mx, 2e-3) << mode;  // the golden tolerance of tests/golden_test.cpp
    worst = std::max(worst, mx);
    double mr = 0;
    for (size_t i = 0; i < golden.size(); ++i)
      mr = std::max(mr, static_cast<double>(std::fabs(other[i] - golden[i])));
    EXPECT_LT(mr, 2e-3) << mode;
    vs_ref = std::max(vs_ref, mr);
  }
  std::printf(
      "[ vision ] logits with two images: vs the float64 reference %.3g, prefill vs split/decode "
      "%.3g (max |diff|)\n",
      vs_ref, worst);
  auto differs_from = [&](const std::vector<float>& other) {
    double mx = 0;
    for (size_t i = first_pad * 512; i < other.size(); ++i)
      mx = std::max(mx, static_cast<double>(std::fabs(other[i] - prefill[i])));
    return mx;
  };
  const auto text_only = logits("prefill", {}, "text.f32");
  EXPECT_EQ(std::memcmp(text_only.data(), prefill.data(), first_pad * 512 * 4), 0);
  EXPECT_GT(differs_from(text_only), 0.1);
  // Swapped: tiny_20x9 takes the first placeholder and la_gray the next four.
  EXPECT_GT(differs_from(logits("prefill", {tiny, la}, "swapped.f32")), 0.1);

  auto r = test::run_deltafin({"logits", "--model", dir, "--tokens", id_list(ids), "--image", la,
                               "--out", tmp + "/one.f32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("take 4 media placeholder tokens (id 277), but --tokens holds 5"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(tmp + "/one.f32"));
  r = test::run_deltafin({"logits", "--model", test::data_dir() + "/k3-tiny-bf16/model", "--tokens",
                          id_list(ids), "--image", la, "--out", tmp + "/none.f32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds no vision tower"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deltafin
