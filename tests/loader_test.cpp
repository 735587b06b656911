// Malformed checkpoints: every defect gives an error that names the file or tensor and what was
// expected, through the library and the real binary; nothing crashes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "model/model.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string copy_model(const std::string& name = "k3-tiny-bf16") {
  std::string dst = test::temp_dir("loader") + "/model";
  fs::copy(test::data_dir() + "/" + name + "/model", dst, fs::copy_options::recursive);
  for (auto& e : fs::directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
  }
  return dst;
}

// Rewrites one shard's header with `edit`, keeping the data region as it was.
void edit_header(const std::string& file, const std::function<void(json&)>& edit) {
  std::string raw = test::slurp(file);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  json h = json::parse(raw.substr(8, n));
  edit(h);
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  uint64_t m = hs.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &m, 8);
  test::spit(file, out + hs + raw.substr(8 + n));
}

std::string shard_of(const std::string& dir, const std::string& tensor) {
  json idx = json::parse(test::slurp(dir + "/model.safetensors.index.json"));
  return dir + "/" + idx["weight_map"][tensor].get<std::string>();
}

std::string load_error(const std::string& dir) {
  try {
    open_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kNorm = "language_model.model.layers.2.input_layernorm.weight";

TEST(Loader, TruncatedShard) {
  auto dir = copy_model();
  std::string f = shard_of(dir, kNorm);
  fs::resize_file(f, fs::file_size(f) / 2);
  std::string e = load_error(dir);
  EXPECT_NE(e.find(fs::path(f).filename().string()), std::string::npos) << e;
  EXPECT_NE(e.find("points outside the file's data region"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(Loader, ShardShorterThanItsHeaderLength) {
  auto dir = copy_model();
  std::string f = shard_of(dir, kNorm);
  fs::resize_file(f, 100);
  std::string e = load_error(dir);
  EXPECT_NE(e.find("header length"), std::string::npos) << e;
  EXPECT_NE(e.find("points past the end of the file"), std::string::npos) << e;
  fs::resize_file(f, 3);
  e = load_error(dir);
  EXPECT_NE(e.find("truncated safetensors file (3 bytes"), std::string::npos) << e;
}

TEST(Loader, HeaderOffsetsOutsideTheFile) {
  auto dir = copy_model();
  std::string f = shard_of(dir, kNorm);
  edit_header(f, [](json& h) { h[kNorm]["data_offsets"][1] = 1ull << 40; });
  std::string e = load_error(dir);
  EXPECT_NE(e.find(kNorm), std::string::npos) << e;
  EXPECT_NE(e.find("points outside"), std::string::npos) << e;
}

TEST(Loader, OffsetsThatDisagreeWithTheShape) {
  auto dir = copy_model();
  std::string f = shard_of(dir, kNorm);
  edit_header(f, [](json& h) {
    h[kNorm]["data_offsets"][1] = h[kNorm]["data_offsets"][1].get<uint64_t>() - 2;
  });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("BF16 [256] needs 512 bytes but data_offsets give 510"), std::string::npos) << e;
}

TEST(Loader, BadJsonEverywhere) {
  {
    auto dir = copy_model();
    test::spit(dir + "/config.json", "{\"architectures\": [");
    std::string e = load_error(dir);
    EXPECT_NE(e.find("config.json: not valid JSON"), std::string::npos) << e;
  }
  {
    auto dir = copy_model();
    test::spit(dir + "/model.safetensors.index.json", "{ nope");
    std::string e = load_error(dir);
    EXPECT_NE(e.find("model.safetensors.index.json: not valid JSON"), std::string::npos) << e;
  }
  {
    auto dir = copy_model();
    std::string f = shard_of(dir, kNorm);
    std::string raw = test::slurp(f);
    raw[9] = '#';  // inside the header JSON
    test::spit(f, raw);
    std::string e = load_error(dir);
    EXPECT_NE(e.find("safetensors header is not valid JSON"), std::string::npos) << e;
    EXPECT_NE(e.find(fs::path(f).filename().string()), std::string::npos) << e;
  }
}

TEST(Loader, UnknownAndUnusableDtypes) {
  {
    auto dir = copy_model();
    edit_header(shard_of(dir, kNorm), [](json& h) { h[kNorm]["dtype"] = "Q4_K"; });
    std::string e = load_error(dir);
    EXPECT_NE(e.find("unknown dtype \"Q4_K\""), std::string::npos) << e;
  }
  {
    auto dir = copy_model();  // F16 has BF16's size, so the header stays consistent
    edit_header(shard_of(dir, kNorm), [](json& h) { h[kNorm]["dtype"] = "F16"; });
    std::string e = load_error(dir);
    EXPECT_NE(e.find("wrong dtype"), std::string::npos) << e;
    EXPECT_NE(e.find(kNorm + ": expected BF16, found F16"), std::string::npos) << e;
  }
}

TEST(Loader, MissingExtraAndMisShapedTensorsInOneError) {
  auto dir = copy_model();
  const std::string gone = "language_model.model.layers.4.self_attn.q_proj.weight";
  const std::string reshaped = "language_model.model.layers.1.post_attention_layernorm.weight";
  edit_header(shard_of(dir, gone), [&](json& h) { h.erase(gone); });
  edit_header(shard_of(dir, reshaped), [&](json& h) { h[reshaped]["shape"] = {16, 16}; });
  // An extra tensor reusing another's bytes would overlap; give it a zero-size entry instead.
  const std::string extra = "language_model.model.layers.0.self_attn.mystery.weight";
  edit_header(shard_of(dir, kNorm), [&](json& h) {
    h[extra] = {{"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
    h["vision_tower.patch_embed.weight"] = {
        {"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  });
  json idx = json::parse(test::slurp(dir + "/model.safetensors.index.json"));
  idx["weight_map"].erase(gone);
  test::spit(dir + "/model.safetensors.index.json", idx.dump());
  std::string e = load_error(dir);
  EXPECT_NE(e.find("missing (1):\n    " + gone + " (expected BF16 [192, 256])"), std::string::npos)
      << e;
  EXPECT_NE(e.find("\n    " + extra), std::string::npos) << e;
  EXPECT_NE(e.find("wrong shape (1):\n    " + reshaped + ": expected [256], found [16, 16]"),
            std::string::npos)
      << e;
  // A vision tensor is checked against vision_config (docs/VISION.md §11), and this golden model's
  // placeholder vision_config describes no tower of width 256: the tensor is listed, with why.
  EXPECT_NE(e.find("extra (2):"), std::string::npos) << e;
  EXPECT_NE(e.find("vision_tower.patch_embed.weight"), std::string::npos) << e;
  EXPECT_NE(
      e.find("vision_config.text_hidden_size (7168) must equal text_config.hidden_size (256)"),
      std::string::npos)
      << e;
}

TEST(Loader, IndexNamesAMissingShardOrTensor) {
  {
    auto dir = copy_model();
    json idx = json::parse(test::slurp(dir + "/model.safetensors.index.json"));
    idx["weight_map"][kNorm] = "model-00009-of-000009.safetensors";
    test::spit(dir + "/model.safetensors.index.json", idx.dump());
    std::string e = load_error(dir);
    EXPECT_NE(e.find("model-00009-of-000009.safetensors: shard file is missing"), std::string::npos)
        << e;
  }
  {
    auto dir = copy_model();
    json idx = json::parse(test::slurp(dir + "/model.safetensors.index.json"));
    idx["weight_map"]["language_model.model.layers.0.not_there"] =
        "model-00001-of-000002.safetensors";
    test::spit(dir + "/model.safetensors.index.json", idx.dump());
    std::string e = load_error(dir);
    EXPECT_NE(e.find("language_model.model.layers.0.not_there is listed in weight_map"),
              std::string::npos)
        << e;
  }
}

TEST(Loader, ConfigFieldsAreValidatedByName) {
  auto dir = copy_model();
  json c = json::parse(test::slurp(dir + "/config.json"));
  c["text_config"]["hidden_size"] = "wide";
  c["text_config"]["linear_attn_config"]["full_attn_layers"] = {4, 8};
  c["text_config"].erase("rms_norm_eps");
  test::spit(dir + "/config.json", c.dump());
  std::string e = load_error(dir);
  EXPECT_NE(e.find("text_config.hidden_size: expected an integer, found \"wide\""),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("text_config.rms_norm_eps: missing"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 9 (1-based) must appear in exactly one"), std::string::npos) << e;
}

TEST(Loader, FolderWithoutCheckpoint) {
  std::string dir = test::temp_dir("empty");
  EXPECT_NE(load_error(dir).find("no config.json"), std::string::npos);
  auto m = copy_model();
  for (auto& e : fs::directory_iterator(m)) {
    if (e.path().extension() == ".json" && e.path().filename() != "config.json")
      fs::remove(e.path());
  }
  EXPECT_NE(load_error(m).find("no model.safetensors or model.safetensors.index.json"),
            std::string::npos);
}

TEST(Loader, BinaryReportsOneLineErrorsAndNeverCrashes) {
  auto dir = copy_model("k3-tiny-mxfp4");
  std::string f = shard_of(dir, "language_model.model.embed_tokens.weight");
  fs::resize_file(f, fs::file_size(f) - 1000);
  auto r = test::run_deltafin({"logits", "--model", dir, "--tokens", "1,2", "--out", dir + "/x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("deltafin: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  r = test::run_deltafin({"inspect", "--model", test::temp_dir("nothing")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no config.json"), std::string::npos) << r.err;
}

TEST(Loader, MxfpExpertsDeclaredButStoredAsBf16) {
  auto dir = copy_model("k3-tiny-bf16");
  json c = json::parse(test::slurp(dir + "/config.json"));
  json q = json::parse(test::slurp(test::data_dir() + "/k3-tiny-mxfp4/model/config.json"));
  c["text_config"]["quantization_config"] = q["text_config"]["quantization_config"];
  test::spit(dir + "/config.json", c.dump());
  std::string e = load_error(dir);
  EXPECT_NE(e.find("MXFP4 routed experts expected, as the config has a quantization_config"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("experts.0.w1.weight_packed (expected U8 [64, 64])"), std::string::npos) << e;
}

}  // namespace
}  // namespace deltafin
