// Images in the prompt of a real generation (docs/VISION.md §6, §11.7): the chat renderer's image
// segment against ids composed independently (the rendered text with its one <|media_pad|>
// expanded to the reference processor's token count from tests/data/vision/expected.json, encoded
// with the special tokens recognised), the prefix store's key ids, hostile image parts, and
// through the real binary on a `make-model --vision tiny` checkpoint: render/tokenize spans, `run
// --image` greedy with and without drafting, `chat /image` across turns with the kept state and
// with a full prefill, snapshots that two conversations differing only in an image do not share,
// a text-only model's refusal, and `serve` taking an OpenAI image_url part.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "engine/vision_encoder.h"
#include "runtime/images.h"
#include "server_util.h"
#include "test_util.h"
#include "tokenizer/base64.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const char* kLaGraySha = "a023f975a83d9036482275df49cfc9ddf7b7a684590ee9196188e2288e392cf5";

std::string vision_data(const std::string& name) {
  return test::data_dir() + "/vision/" + name;
}

// The test tokenizer (tests/data/tokenizer) with K3's four media tokens added after its specials.
const Tokenizer& media_tok() {
  static const Tokenizer t = [] {
    const std::string d = test::temp_dir("vp-tokenizer");
    fs::copy(test::data_dir() + "/tokenizer/tiktoken.model", d + "/tiktoken.model");
    json cfg = json::parse(test::slurp(test::data_dir() + "/tokenizer/tokenizer_config.json"));
    const char* names[4] = {"<|media_begin|>", "<|media_content|>", "<|media_end|>",
                            "<|media_pad|>"};
    for (int i = 0; i < 4; ++i) {
      cfg["added_tokens_decoder"][std::to_string(100262 + i)] = {
          {"content", names[i]}, {"lstrip", false},      {"normalized", false},
          {"rstrip", false},     {"single_word", false}, {"special", true}};
    }
    test::spit(d + "/tokenizer_config.json", cfg.dump(1));
    return Tokenizer::load(d);
  }();
  return t;
}

const VisionEncoder& tiny_encoder() {
  static const auto enc = VisionEncoder::open(test::data_dir() + "/k3-tiny-vision/model");
  return *enc;
}

std::string data_url(const std::string& path, const char* type = "image/png") {
  return std::string("data:") + type + ";base64," + base64::encode(test::slurp(path));
}

json image_part(const std::string& path) {
  return {{"type", "image_url"}, {"image_url", {{"url", data_url(path)}}}};
}

// The reference: the rendered text with each image's one <|media_pad|> expanded to its token
// count (from the Python reference processor's expected.json), encoded with specials.
std::vector<int32_t> composed_ids(const std::string& text, const std::vector<int64_t>& tokens) {
  std::string expanded;
  size_t at = 0, k = 0;
  const std::string pad = "<|media_pad|>";
  for (size_t p = text.find(pad); p != std::string::npos; p = text.find(pad, at)) {
    expanded += text.substr(at, p - at);
    for (int64_t i = 0; i < tokens.at(k); ++i) expanded += pad;
    ++k;
    at = p + pad.size();
  }
  expanded += text.substr(at);
  EXPECT_EQ(k, tokens.size());
  return media_tok().encode_with_special(expanded);
}

TEST(VisionPrompt, RendererLaysOutOneAndTwoImages) {
  const json expected = json::parse(test::slurp(vision_data("expected.json")))["images"];
  const ImageMeasurer measure = image_measurer(&tiny_encoder());
  // One image before the text.
  json body = {
      {"messages",
       json::array({{{"role", "user"},
                     {"content", json::array({image_part(vision_data("la_gray.png")),
                                              {{"type", "text"}, {"text", "What is this?"}}})}}})}};
  RenderedPrompt one = render_json(body, media_tok(), measure);
  ASSERT_EQ(one.images.size(), 1u);
  const json& la = expected["la_gray.png"];
  EXPECT_NE(one.text.find("<|media_begin|>image 45x33<|media_content|><|media_pad|><|media_end|>"
                          "What is this?"),
            std::string::npos)
      << one.text;
  EXPECT_EQ(one.images[0].width, la["width"].get<int64_t>());
  EXPECT_EQ(one.images[0].height, la["height"].get<int64_t>());
  EXPECT_EQ(one.images[0].tokens, la["num_tokens"].get<int64_t>());
  EXPECT_EQ(image_hash_hex(one.images[0].hash), kLaGraySha);
  EXPECT_EQ(one.ids, composed_ids(one.text, {la["num_tokens"].get<int64_t>()}));
  const PromptImage& im = one.images[0];
  EXPECT_EQ(one.ids[static_cast<size_t>(im.segment_begin)], 100262);
  EXPECT_EQ(one.ids[static_cast<size_t>(im.pad_begin - 1)], 100263);
  for (int64_t p = im.pad_begin; p < im.pad_begin + im.tokens; ++p)
    EXPECT_EQ(one.ids[static_cast<size_t>(p)], 100265);
  EXPECT_EQ(im.segment_end, im.pad_begin + im.tokens + 1);
  EXPECT_EQ(one.ids[static_cast<size_t>(im.segment_end - 1)], 100264);

  // Two images around text, in a system message and a user message (OpenAI's string form of
  // image_url and the `image` type too), and a photo of many tokens.
  body = {{"messages",
           json::array({{{"role", "system"},
                         {"content", json::array({{{"type", "text"}, {"text", "Look: "}},
                                                  {{"type", "image"},
                                                   {"image_url", data_url(vision_data("photo.jpg"),
                                                                          "image/jpeg")}}})}},
                        {{"role", "user"},
                         {"content", json::array({{{"type", "text"}, {"text", "A "}},
                                                  image_part(vision_data("tiny_20x9.png")),
                                                  {{"type", "text"}, {"text", " and B "}},
                                                  image_part(vision_data("la_gray.png"))})}}})}};
  RenderedPrompt two = render_json(body, media_tok(), measure);
  ASSERT_EQ(two.images.size(), 3u);
  std::vector<int64_t> counts;
  for (const char* n : {"photo.jpg", "tiny_20x9.png", "la_gray.png"})
    counts.push_back(expected[n]["num_tokens"].get<int64_t>());
  EXPECT_EQ(two.ids, composed_ids(two.text, counts));
  EXPECT_NE(two.text.find("Look: <|media_begin|>image 640x427<|media_content|>"),
            std::string::npos);
  EXPECT_NE(two.text.find("A <|media_begin|>image 20x9<|media_content|><|media_pad|><|media_end|>"
                          " and B <|media_begin|>image 45x33"),
            std::string::npos)
      << two.text;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(two.images[i].tokens, counts[i]);
  EXPECT_LT(two.images[0].segment_end, two.images[1].segment_begin);
  EXPECT_EQ(two.images[1].name, "messages[1].content[1]");
}

TEST(VisionPrompt, ImagePartsAreCheckedAndRefusedClearly) {
  const ImageMeasurer measure = image_measurer(&tiny_encoder());
  auto error_of = [&](const json& part, const ImageMeasurer& m) -> std::string {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", json::array({part})}}})}};
    try {
      render_json(body, media_tok(), m);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  const std::string png = vision_data("la_gray.png");
  EXPECT_NE(error_of(image_part(png), {})
                .find("messages[0].content[0]: image parts need a model with a vision tower"),
            std::string::npos);
  EXPECT_NE(error_of(image_part(png), image_measurer(nullptr)).find("has no vision tower"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"type", "image_url"}, {"image_url", {{"url", "https://x.test/a.png"}}}}, measure)
          .find("remote image URLs are not fetched"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"type", "image_url"}, {"image_url", {{"url", "data:text/plain;base64,aGk="}}}},
               measure)
          .find("expected an image type"),
      std::string::npos);
  EXPECT_NE(error_of({{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,@@@"}}}},
                     measure)
                .find("not valid base64"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"type", "image_url"}, {"image_url", {{"url", "data:image/png,abc"}}}}, measure)
          .find("not base64"),
      std::string::npos);
  EXPECT_NE(error_of({{"type", "image_url"}}, measure).find("needs image_url.url"),
            std::string::npos);
  EXPECT_NE(error_of({{"type", "image_url"}, {"image_url", {{"url", 5}}}}, measure)
                .find("image_url.url: expected a data URL string"),
            std::string::npos);
  // Not an image, a truncated one, a bomb: the vision layer's errors, naming the part.
  for (const char* bad : {"hostile_not_image.png", "hostile_truncated.png", "hostile_bomb.png"}) {
    const std::string e = error_of(image_part(vision_data(bad)), measure);
    EXPECT_EQ(e.rfind("messages[0].content[0]", 0), 0u) << bad << ": " << e;
  }
  // The K2 formats take text only.
  const Tokenizer k2 = media_tok().with_chat_format(ChatFormat::k2_instruct);
  json body = {
      {"messages", json::array({{{"role", "user"}, {"content", json::array({image_part(png)})}}})}};
  try {
    render_json(body, k2, measure);
    ADD_FAILURE() << "a K2 format took an image";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("image parts need K3's chat format"), std::string::npos);
  }
}

TEST(VisionPrompt, PlaceholdersAndContentRoundTrip) {
  ChatImage a, b;
  a.bytes = std::make_shared<const std::string>(test::slurp(vision_data("la_gray.png")));
  a.media_type = "image/png";
  a.name = "a";
  b = a;
  b.name = "b";
  ChatMessage m;
  place_images("x<|kimi_image_placeholder|>y<|kimi_image_placeholder|>", {a, b}, m);
  EXPECT_EQ(m.content, "xy");
  ASSERT_EQ(m.images.size(), 2u);
  EXPECT_EQ(m.images[0].offset, 1u);
  EXPECT_EQ(m.images[1].offset, 2u);
  ChatMessage before;
  place_images("text", {a}, before);
  EXPECT_EQ(before.images[0].offset, 0u);
  ChatMessage bad;
  EXPECT_THROW(place_images("<|kimi_image_placeholder|>", {a, b}, bad), InvalidArgument);
  // content_json writes what from_json reads back.
  json req = {{"messages", json::array({{{"role", "user"}, {"content", content_json(m)}}})}};
  const ChatRequest back = ChatRequest::from_json(req);
  ASSERT_EQ(back.messages[0].images.size(), 2u);
  EXPECT_EQ(back.messages[0].content, "xy");
  EXPECT_EQ(back.messages[0].images[1].offset, 2u);
  EXPECT_EQ(*back.messages[0].images[0].bytes, *a.bytes);
}

TEST(VisionPrompt, StateKeysCarryTheImageHash) {
  const std::vector<int32_t> ids = {1, 2, 10, 11, 12, 13, 9, 9, 9, 14, 3};
  PromptImage img;
  img.segment_begin = 2;
  img.pad_begin = 6;
  img.tokens = 3;
  img.segment_end = 10;
  EXPECT_EQ(state_key_ids(ids, {}), ids);  // text-only keys are the ids
  for (size_t i = 0; i < 32; ++i) img.hash[i] = static_cast<uint8_t>(i * 7 + 1);
  const auto k1 = state_key_ids(ids, std::span<const PromptImage>(&img, 1));
  PromptImage other = img;
  other.hash[31] ^= 1;  // one bit of the last word: the segment's 8th position differs
  const auto k2 = state_key_ids(ids, std::span<const PromptImage>(&other, 1));
  EXPECT_EQ(k1, state_key_ids(ids, std::span<const PromptImage>(&img, 1)));
  EXPECT_NE(k1, k2);
  for (size_t p = 0; p < ids.size(); ++p) {
    if (p < 2 || p >= 10) {
      EXPECT_EQ(k1[p], ids[p]) << p;
    } else {
      EXPECT_LT(k1[p], 0) << p;
    }
  }
  EXPECT_EQ(std::vector<int32_t>(k1.begin(), k1.begin() + 9),
            std::vector<int32_t>(k2.begin(), k2.begin() + 9));
  EXPECT_NE(k1[9], k2[9]);
}

// ---------------------------------------------------------------------------------------------
// Through the binary.

const std::string& vision_model() {
  static const std::string dir = test::shared_model({"--vision", "tiny", "--quiet"});
  return dir;
}

TEST(VisionPrompt, RenderAndTokenizeShowTheSpans) {
  const std::string req = test::temp_dir("vp-render") + "/req.json";
  json body = {
      {"messages",
       json::array({{{"role", "user"},
                     {"content", json::array({{{"type", "text"}, {"text", "see "}},
                                              image_part(vision_data("la_gray.png"))})}}})}};
  test::spit(req, body.dump());
  auto r = test::run_deltafin({"render", "--model", vision_model(), "--request", req, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["images"].size(), 1u);
  const json& im = j["images"][0];
  EXPECT_EQ(im["width"], 45);
  EXPECT_EQ(im["height"], 33);
  EXPECT_EQ(im["tokens"], 4);
  EXPECT_EQ(im["sha256"], kLaGraySha);
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  const int64_t pb = im["pads"][0];
  EXPECT_EQ(im["pads"][1].get<int64_t>(), pb + 4);
  for (int64_t p = pb; p < pb + 4; ++p) EXPECT_EQ(ids[static_cast<size_t>(p)], 256 + 21);
  EXPECT_EQ(ids[static_cast<size_t>(im["segment"][0].get<int64_t>())], 256 + 18);

  r = test::run_deltafin({"tokenize", "--model", vision_model(), "--text",
                          "a<|kimi_image_placeholder|>b", "--image", vision_data("tiny_20x9.png")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json t = json::parse(r.out);
  ASSERT_EQ(t["images"].size(), 1u);
  EXPECT_EQ(t["images"][0]["tokens"], 1);
  EXPECT_EQ(t["images"][0]["segment"][0], 1);  // after "a"
  const auto tids = t["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(tids[static_cast<size_t>(t["images"][0]["pads"][0].get<int64_t>())], 256 + 21);
  EXPECT_EQ(t["images"][0]["segment"][1], t["images"][0]["pads"][1].get<int64_t>() + 1);
  EXPECT_EQ(tids.size(), t["images"][0]["segment"][1].get<size_t>() + 1);  // then "b"

  // No tower: render refuses the image part.
  const std::string text_only = test::temp_dir("vp-text") + "/model";
  ASSERT_EQ(test::run_deltafin({"make-model", text_only, "--quiet"}).exit_code, 0);
  r = test::run_deltafin({"render", "--model", text_only, "--request", req});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no vision tower"), std::string::npos) << r.err;
}

TEST(VisionPrompt, RunWithImagesIsTheSameWithAndWithoutDrafting) {
  const std::string la = vision_data("la_gray.png"), tiny = vision_data("tiny_20x9.png");
  const std::vector<std::string> base = {
      "run",     "--model", vision_model(), "--prompt", "Describe it", "--image",   la,
      "--image", tiny,      "--max-new",    "12",       "--json",      "--threads", "1"};
  auto run = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = test::run_deltafin(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  };
  const json plain = run({"--draft", "none", "--stats"});
  ASSERT_EQ(plain["prompt_images"].size(), 2u);
  EXPECT_EQ(plain["images"], 2);
  EXPECT_EQ(plain["image_tokens"], 5);
  EXPECT_EQ(plain["images_encoded"], 2);
  const auto completion = plain["completion_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(completion.empty());
  EXPECT_EQ(run({"--draft", "ngram"})["completion_ids"], plain["completion_ids"]);
  // A drafter that proposes the known answer: every draft is verified against the image rows.
  const std::string known = test::temp_dir("vp-known") + "/known.json";
  test::spit(known, json(completion).dump());
  const json replayed = run({"--draft", "replay:" + known});
  EXPECT_EQ(replayed["completion_ids"], plain["completion_ids"]);
  EXPECT_GT(replayed["draft_accepted"].get<int64_t>(), 0) << replayed.dump();
  // Prompt rows cut into passes of 3 (inside the images' runs): the same answer.
  EXPECT_EQ(run({"--prefill-chunk", "3"})["completion_ids"], plain["completion_ids"]);
  // --stats names the vision time and image tokens.
  auto r = test::run_deltafin({"run", "--model", vision_model(), "--prompt", "x", "--image", la,
                               "--max-new", "2", "--stats"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(\[stats\] vision 1 image \(4 image tokens\): 1 encoded in [0-9.]+ s)")))
      << r.err;
  // A text-only model refuses an image, naming it.
  const std::string text_only = test::temp_dir("vp-text2") + "/model";
  ASSERT_EQ(test::run_deltafin({"make-model", text_only, "--quiet"}).exit_code, 0);
  r = test::run_deltafin({"run", "--model", text_only, "--prompt", "x", "--image", la});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(la + ": this model has no vision tower"), std::string::npos) << r.err;
  // A bad image file is refused before anything runs.
  r = test::run_deltafin({"run", "--model", vision_model(), "--prompt", "x", "--image",
                          vision_data("hostile_truncated.png")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("hostile_truncated.png"), std::string::npos) << r.err;
}

// From chat's --stats lines: turn `turn`'s reused tokens (kept state or snapshot) and prefilled
// tokens.
int64_t stat_reused(const std::string& err, size_t turn) {
  const std::regex re(R"(\[stats\] prefill \d+ tokens in ([^\n]*))");
  const std::regex reused(R"(, (\d+) reused)");
  size_t k = 0;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it, ++k) {
    if (k != turn) continue;
    const std::string line = (*it)[1].str();
    std::smatch m;
    return std::regex_search(line, m, reused) ? std::stoll(m[1].str()) : 0;
  }
  ADD_FAILURE() << "no stats for turn " << turn << " in " << err;
  return -1;
}

int64_t stat_prefilled(const std::string& err, size_t turn) {
  std::regex re(R"(\[stats\] prefill (\d+) tokens)");
  size_t k = 0;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it, ++k) {
    if (k == turn) return std::stoll((*it)[1].str());
  }
  ADD_FAILURE() << "no stats for turn " << turn;
  return -1;
}

TEST(VisionPrompt, ChatKeepsTheImageAcrossTurns) {
  const std::string la = vision_data("la_gray.png");
  const std::vector<std::string> base = {"chat",      "--model", vision_model(), "--threads", "1",
                                         "--max-new", "8",       "--no-color",   "--stats"};
  // Turn 2 continues the kept state (the image is not encoded again); /retry prefills the whole
  // conversation from nothing (no state cache), encoding the image again: the same answer.
  auto args = base;
  args.insert(args.end(), {"--state-cache", "none"});
  auto r = test::run_deltafin(args, "/image " + la + "\nWhat is it?\nAnd the colour?\n/retry\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("image " + la + " (45x33, 4 tokens) attached"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vision 1 image (4 image tokens): 1 encoded"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vision 1 image (4 image tokens): 0 encoded"), std::string::npos) << r.err;
  EXPECT_GT(stat_reused(r.err, 1), 0);
  EXPECT_EQ(stat_reused(r.err, 2), 0);  // the retry: a full prefill
  EXPECT_EQ(stat_prefilled(r.err, 2), stat_prefilled(r.err, 1) + stat_reused(r.err, 1));
  // stdout holds the three answers; the second and the third (its retry) must be the same. The
  // tiny model's text may hold newlines, so the answers are cut apart by running the same
  // conversation without the retry and with one turn.
  auto r2 = test::run_deltafin(args, "/image " + la + "\nWhat is it?\nAnd the colour?\n");
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  ASSERT_GT(r.out.size(), r2.out.size());
  const std::string turn12 = r2.out;
  ASSERT_EQ(r.out.substr(0, turn12.size()), turn12);
  const std::string retry = r.out.substr(turn12.size());
  auto r1 = test::run_deltafin(args, "/image " + la + "\nWhat is it?\n");
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_EQ(turn12.substr(r1.out.size()), retry);

  // An image on a model without a tower: refused, the session goes on.
  const std::string text_only = test::temp_dir("vp-text3") + "/model";
  ASSERT_EQ(test::run_deltafin({"make-model", text_only, "--quiet"}).exit_code, 0);
  r = test::run_deltafin({"chat", "--model", text_only, "--max-new", "2", "--state-cache", "none"},
                         "/image " + la + "\nhi\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("this model has no vision tower"), std::string::npos) << r.err;
}

TEST(VisionPrompt, SnapshotsAreKeyedByTheImage) {
  // la_gray_inverted.png is la_gray.png with its grey inverted (Pillow, ImageOps.invert on the L
  // band): the same size and token count, so the two prompts' ids are the same and only the
  // key's image hash tells them apart.
  const std::string la = vision_data("la_gray.png"), other = vision_data("la_gray_inverted.png");
  const std::string cache = test::temp_dir("vp-states");
  const std::vector<std::string> args = {
      "chat", "--model",    vision_model(), "--threads",     "1",  "--max-new",
      "6",    "--no-color", "--stats",      "--state-cache", cache};
  // Three one-turn conversations: an image, another image with the same words, the first again.
  auto r = test::run_deltafin(args, "/image " + la + "\nWhat is it?\n/reset\n/image " + other +
                                        "\nWhat is it?\n/reset\n/image " + la + "\nWhat is it?\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int64_t first_prompt = stat_prefilled(r.err, 0) + stat_reused(r.err, 0);
  // Where the image's segment starts: the same rendering through `render`.
  const std::string req = test::temp_dir("vp-req") + "/req.json";
  json body = {
      {"messages",
       json::array({{{"role", "user"},
                     {"content", json::array({image_part(la),
                                              {{"type", "text"}, {"text", "What is it?"}}})}}})}};
  test::spit(req, body.dump());
  auto rr = test::run_deltafin({"render", "--model", vision_model(), "--request", req, "--json"});
  ASSERT_EQ(rr.exit_code, 0) << rr.err;
  const json rj = json::parse(rr.out);
  const int64_t segment_begin = rj["images"][0]["segment"][0];
  const int64_t segment_end = rj["images"][0]["segment"][1];
  EXPECT_EQ(static_cast<int64_t>(rj["ids"].size()), first_prompt);
  // The other image (the very same ids) shares at most what comes before the image.
  EXPECT_LE(stat_reused(r.err, 1), segment_begin);
  // The same image again continues past it (the snapshot after the messages), with the first
  // conversation's answer.
  EXPECT_GE(stat_reused(r.err, 2), segment_end);
  EXPECT_NE(r.err.find("vision 1 image (4 image tokens): 0 encoded"), std::string::npos) << r.err;
  auto alone = test::run_deltafin({"chat", "--model", vision_model(), "--threads", "1", "--max-new",
                                   "6", "--no-color", "--state-cache", "none"},
                                  "/image " + la + "\nWhat is it?\n");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  ASSERT_GE(r.out.size(), alone.out.size());
  EXPECT_EQ(r.out.substr(r.out.size() - alone.out.size()), alone.out);
}

// The server's chat path: an image_url part is rendered, encoded and answered as `run --chat
// --image` answers the same turn (greedy); a text-only server still refuses it with a 400.
TEST(VisionPrompt, ServeAnswersAnImageAsRunDoes) {
  const std::string la = vision_data("la_gray.png");
  auto ran = test::run_deltafin({"run", "--model", vision_model(), "--chat", "--prompt",
                                 "What is it?", "--image", la, "--max-new", "6", "--json",
                                 "--threads", "1", "--draft", "none"});
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  const json want = json::parse(ran.out);
  test::ServerProcess srv({"--threads", "1", "--draft", "none", "--state-cache", "none"},
                          vision_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const json body = {
      {"model", "kimi-k3"},
      {"temperature", 0},
      {"max_tokens", 6},
      {"messages",
       json::array({{{"role", "user"},
                     {"content", json::array({image_part(la),
                                              {{"type", "text"}, {"text", "What is it?"}}})}}})}};
  const test::HttpResult r = test::post_json(*c, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["usage"]["prompt_tokens"].get<size_t>(), want["prompt_ids"].size());
  EXPECT_EQ(r.j["usage"]["completion_tokens"].get<size_t>(), want["completion_ids"].size());
  const json& msg = r.j["choices"][0]["message"];
  const std::string content = msg["content"].is_string() ? msg["content"].get<std::string>() : "";
  EXPECT_EQ(content, want["text"].get<std::string>()) << r.body;
  // A remote URL: one 400 naming the part.
  json remote = body;
  remote["messages"][0]["content"][0]["image_url"]["url"] = "https://example.test/a.png";
  const test::HttpResult bad = test::post_json(*c, "/v1/chat/completions", remote);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("remote image URLs are not fetched"), std::string::npos) << bad.body;
  srv.stop();
  // A text-only model: image parts are refused (400), as before.
  test::ServerProcess text({"--threads", "1", "--state-cache", "none"}, test::server_model_dir());
  ASSERT_TRUE(text.ready()) << text.err();
  auto tc = text.client();
  const test::HttpResult refused = test::post_json(*tc, "/v1/chat/completions", body);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("messages[0].content[0]"), std::string::npos) << refused.body;
}

}  // namespace
}  // namespace deltafin
