// Images through the C API (include/deltafin/deltafin.h) via libdeltafin.so's exported calls: a
// chat's attached images (bytes and a path, deltafin_chat_add_image / _file) and a chat request's
// OpenAI image_url parts (deltafin_create_chat_completion), on a checkpoint with the tiny vision
// tower. Each check looks at what reached the prompt — the stream's stats count the image's
// <|media_pad|> tokens as the engine's own plan gives them, and the tower ran (or, in a later
// turn, did not: the image is in the kept state) — not only that a call returned OK. Hostile
// input (no bytes, a truncated or non-image file, a folder, a missing file, too many images, a
// text-only model) is one ARGUMENT error naming the image, and leaves the chat usable.
#include <deltafin/deltafin.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "engine/vision_encoder.h"
#include "fixtures/synthetic.h"
#include "test_util.h"
#include "tokenizer/base64.h"

namespace deltafin {
namespace {

using nlohmann::json;

const std::string& capimg_vision_model() {
  static const std::string dir = [] {
    std::string d = test::temp_dir("capi-images") + "/model";
    SyntheticSpec spec = synthetic_preset("tiny");
    spec.vision = synthetic_vision_preset("tiny");
    make_model(d, spec);
    return d;
  }();
  return dir;
}

const std::string& capimg_text_model() {
  static const std::string dir = [] {
    std::string d = test::temp_dir("capi-images-text") + "/model";
    make_model(d, synthetic_preset("tiny"));
    return d;
  }();
  return dir;
}

deltafin_model* capimg_load(const std::string& dir) {
  deltafin_model_params p;
  deltafin_model_params_init(&p);
  p.threads = 2;
  p.memory_budget = 1ull << 30;
  p.ctx = 2048;
  deltafin_model* m = nullptr;
  EXPECT_EQ(deltafin_model_load(dir.c_str(), &p, &m), DELTAFIN_OK) << deltafin_last_error();
  return m;
}

std::string capimg_take(char* s) {
  std::string r = s != nullptr ? s : "";
  deltafin_free(s);
  return r;
}

std::string capimg_path(const char* name) {
  return test::data_dir() + "/vision/" + name;
}

int64_t capimg_tokens(const std::string& file) {
  const std::string bytes = test::slurp(capimg_path(file.c_str()));
  return VisionEncoder::open(capimg_vision_model())
      ->plan(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
             file)
      .num_tokens;
}

// One chat turn: the response and the stream's stats.
std::pair<json, json> capimg_turn(deltafin_chat* c, const char* text) {
  deltafin_stream* s = nullptr;
  const json req = {{"content", text}, {"max_tokens", 4}, {"temperature", 0}};
  EXPECT_EQ(deltafin_chat_send(c, req.dump().c_str(), &s), DELTAFIN_OK) << deltafin_last_error();
  if (s == nullptr) return {};
  char* out = nullptr;
  EXPECT_EQ(deltafin_stream_response(s, &out), DELTAFIN_OK) << deltafin_last_error();
  json resp = json::parse(capimg_take(out));
  EXPECT_EQ(deltafin_stream_stats_json(s, &out), DELTAFIN_OK);
  json stats = json::parse(capimg_take(out));
  deltafin_stream_free(s);
  return {resp, stats};
}

TEST(CApiImages, ChatTakesImagesAsBytesAndPaths) {
  deltafin_model* m = capimg_load(capimg_vision_model());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(deltafin_model_has_vision(m), 1);
  deltafin_chat* c = nullptr;
  ASSERT_EQ(deltafin_chat_new(m, R"({"thinking":false})", &c), DELTAFIN_OK);
  const std::string photo = test::slurp(capimg_path("photo.jpg"));
  const int64_t photo_tokens = capimg_tokens("photo.jpg");
  const int64_t tiny_tokens = capimg_tokens("tiny_20x9.png");
  ASSERT_GT(photo_tokens, tiny_tokens);

  // Turn 1: the photo's bytes and a PNG by path.
  ASSERT_EQ(deltafin_chat_add_image(c, photo.data(), photo.size(), "photo"), DELTAFIN_OK)
      << deltafin_last_error();
  ASSERT_EQ(deltafin_chat_add_image_file(c, capimg_path("tiny_20x9.png").c_str()), DELTAFIN_OK)
      << deltafin_last_error();
  auto [r1, s1] = capimg_turn(c, "What are these?");
  EXPECT_EQ(s1["images"], 2) << s1.dump();
  EXPECT_EQ(s1["image_tokens"], photo_tokens + tiny_tokens);
  EXPECT_EQ(s1["images_encoded"], 2);
  EXPECT_GT(r1["usage"]["prompt_tokens"].get<int64_t>(), photo_tokens + tiny_tokens);
  EXPECT_EQ(r1["usage"]["completion_tokens"], 4);

  // Turn 2, text only: the images are in the kept state and are not encoded again.
  auto [r2, s2] = capimg_turn(c, "And now?");
  EXPECT_EQ(s2["images_encoded"], 0) << s2.dump();
  EXPECT_GT(s2["reused_prompt_tokens"].get<int64_t>(), photo_tokens + tiny_tokens);

  // Attached, then dropped: nothing of them reaches the next turn.
  ASSERT_EQ(deltafin_chat_add_image(c, photo.data(), photo.size(), nullptr), DELTAFIN_OK);
  EXPECT_EQ(deltafin_chat_clear_images(c), 1);
  auto [r3, s3] = capimg_turn(c, "Still there?");
  EXPECT_EQ(s3["images_encoded"], 0) << s3.dump();
  EXPECT_EQ(s3["image_tokens"], photo_tokens + tiny_tokens);  // the conversation's two
  deltafin_chat_free(c);
  deltafin_model_free(m);
}

TEST(CApiImages, ChatCompletionTakesImageUrlParts) {
  deltafin_model* m = capimg_load(capimg_vision_model());
  ASSERT_NE(m, nullptr);
  const std::string photo = test::slurp(capimg_path("photo.jpg"));
  const json req = {
      {"messages",
       json::array(
           {{{"role", "user"},
             {"content",
              json::array({{{"type", "text"}, {"text", "What is this?"}},
                           {{"type", "image_url"},
                            {"image_url",
                             {{"url", "data:image/jpeg;base64," + base64::encode(photo)}}}}})}}})},
      {"max_tokens", 4},
      {"temperature", 0}};
  deltafin_stream* s = nullptr;
  ASSERT_EQ(deltafin_stream_start(m, req.dump().c_str(), 1, &s), DELTAFIN_OK)
      << deltafin_last_error();
  char* out = nullptr;
  ASSERT_EQ(deltafin_stream_response(s, &out), DELTAFIN_OK) << deltafin_last_error();
  const json resp = json::parse(capimg_take(out));
  ASSERT_EQ(deltafin_stream_stats_json(s, &out), DELTAFIN_OK);
  const json stats = json::parse(capimg_take(out));
  deltafin_stream_free(s);
  EXPECT_EQ(stats["images"], 1) << stats.dump();
  EXPECT_EQ(stats["image_tokens"], capimg_tokens("photo.jpg"));
  EXPECT_EQ(stats["images_encoded"], 1);
  EXPECT_EQ(resp["usage"]["completion_tokens"], 4);

  // A truncated image part: one ARGUMENT error naming the part; a remote URL is refused.
  json bad = req;
  bad["messages"][0]["content"][1]["image_url"]["url"] =
      "data:image/jpeg;base64," + base64::encode(photo.substr(0, photo.size() / 2));
  out = nullptr;
  EXPECT_EQ(deltafin_create_chat_completion(m, bad.dump().c_str(), nullptr, nullptr, &out),
            DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("messages[0].content[1]"), std::string::npos)
      << deltafin_last_error();
  bad["messages"][0]["content"][1]["image_url"]["url"] = "https://example.com/a.png";
  EXPECT_EQ(deltafin_create_chat_completion(m, bad.dump().c_str(), nullptr, nullptr, &out),
            DELTAFIN_ERR_ARGUMENT);
  EXPECT_NE(std::string(deltafin_last_error()).find("remote image URLs"), std::string::npos)
      << deltafin_last_error();
  deltafin_model_free(m);
}

TEST(CApiImages, HostileImagesAreArgumentErrorsNamingThem) {
  deltafin_model* m = capimg_load(capimg_vision_model());
  ASSERT_NE(m, nullptr);
  deltafin_chat* c = nullptr;
  ASSERT_EQ(deltafin_chat_new(m, nullptr, &c), DELTAFIN_OK);
  auto refused = [&](deltafin_status st, const std::string& names, const std::string& says) {
    EXPECT_EQ(st, DELTAFIN_ERR_ARGUMENT);
    const std::string e = deltafin_last_error();
    EXPECT_NE(e.find(names), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << e;
  };
  refused(deltafin_chat_add_image(c, nullptr, 0, "empty"), "empty", "no bytes");
  refused(deltafin_chat_add_image(c, nullptr, 5, "null"), "null", "NULL");
  const std::string truncated = test::slurp(capimg_path("hostile_truncated.png"));
  refused(deltafin_chat_add_image(c, truncated.data(), truncated.size(), "cut.png"), "cut.png", "");
  const std::string text = "this is not an image at all";
  refused(deltafin_chat_add_image(c, text.data(), text.size(), "notes.txt"), "notes.txt",
          "PNG, JPEG");
  refused(deltafin_chat_add_image_file(c, capimg_path("hostile_bomb.png").c_str()),
          "hostile_bomb.png", "");
  refused(deltafin_chat_add_image_file(c, capimg_path("no-such.png").c_str()), "no-such.png", "");
  refused(deltafin_chat_add_image_file(c, test::data_dir().c_str()), test::data_dir(), "");
  EXPECT_EQ(deltafin_chat_add_image_file(c, nullptr), DELTAFIN_ERR_ARGUMENT);
  // The count: at most 100 waiting for one message.
  const std::string tiny = test::slurp(capimg_path("tiny_20x9.png"));
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(deltafin_chat_add_image(c, tiny.data(), tiny.size(), nullptr), DELTAFIN_OK) << i;
  refused(deltafin_chat_add_image(c, tiny.data(), tiny.size(), "one more"), "one more",
          "at most 100");
  EXPECT_EQ(deltafin_chat_clear_images(c), 100);
  // None of the refused ones was attached: the chat goes on with text.
  auto [r, s] = capimg_turn(c, "Hello");
  EXPECT_EQ(s["images"], 0) << s.dump();
  deltafin_chat_free(c);
  deltafin_model_free(m);

  // A model without a tower says so.
  deltafin_model* t = capimg_load(capimg_text_model());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(deltafin_model_has_vision(t), 0);
  ASSERT_EQ(deltafin_chat_new(t, nullptr, &c), DELTAFIN_OK);
  refused(deltafin_chat_add_image(c, tiny.data(), tiny.size(), "tiny"), "tiny", "no vision tower");
  deltafin_chat_free(c);
  deltafin_model_free(t);
}

}  // namespace
}  // namespace deltafin
