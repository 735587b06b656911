// What K3's vision tower costs, through the real binary (issue 38 item 5): `bench --image`,
// `/metrics`'s vision counters, the memory plan's share for the tower (`run -v`'s plan lines,
// `doctor --model`), and the bound on an image's patches the plan is sized by.
//
// Why it is built this way:
// - One tiny synthetic K3 with a tiny tower of the released structure (make-model --vision tiny)
//   and the same model without the tower (same seed, so the same text weights): the difference
//   between their plans is the tower's share, compared exactly.
// - Expected figures are computed here from the model's own vision_config and the processor's
//   token counts of the test images (tests/data/vision/expected.json's values: photo.jpg is
//   640 x 427 -> 32 x 46 patches -> 368 tokens), never read back from the engine's output.
// - Times are checked only for being positive: no timed assertions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "server_util.h"
#include "storage/plan.h"
#include "test_util.h"
#include "tokenizer/base64.h"
#include "vision/preprocess.h"

namespace deltafin {
namespace {

using json = nlohmann::ordered_json;

struct CostModels {
  std::string vision, text;
};

// The two models (made once): with a tiny tower, and the same text model without it.
const CostModels& cost_models() {
  static const CostModels m = [] {
    const std::string d = test::temp_dir("vision-cost");
    CostModels out{d + "/vision", d + "/text"};
    auto r = test::run_deltafin({"make-model", out.vision, "--preset", "tiny", "--vision", "tiny",
                                 "--seed", "7", "--quiet"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = test::run_deltafin({"make-model", out.text, "--preset", "tiny", "--seed", "7", "--quiet"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }();
  return m;
}

std::string cost_image(const std::string& name) {
  return test::data_dir() + "/vision/" + name;
}

// The tower's and the projector's parameters from the model's vision_config (docs/VISION.md
// §4.1's tensors), computed independently of the engine.
std::pair<int64_t, int64_t> expected_params(const std::string& model) {
  const json c = json::parse(test::slurp(model + "/config.json"));
  const json& v = c["vision_config"];
  const int64_t D = v["vt_hidden_size"], I = v["vt_intermediate_size"],
                L = v["vt_num_hidden_layers"];
  const int64_t Q = v.value("qkv_hidden_size", D), P = v.value("patch_size", 14);
  const int64_t ph = v.value("init_pos_emb_height", 64), pw = v.value("init_pos_emb_width", 64);
  const int64_t T = v.value("text_hidden_size", int64_t{7168});
  const int64_t M = D * 4;
  const int64_t tower =
      D * 3 * P * P + ph * pw * D + L * (2 * D + 3 * Q * D + D * Q + 2 * I * D) + D;
  return {tower, M * M + T * M + T};
}

TEST(VisionCost, BenchImageReportsTheTowerPerImage) {
  const CostModels& m = cost_models();
  const auto r = test::run_deltafin({"bench", "--model", m.vision, "--prompt-tokens", "8",
                                     "--gen-tokens", "2", "--reps", "2", "--no-disk-probe",
                                     "--no-in-ram-reference", "--image", cost_image("photo.jpg"),
                                     "--image", cost_image("tiny_20x9.png"), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  // The bench figures are all still there, beside the vision object.
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  const json& v = j["vision"];
  const auto [tower, projector] = expected_params(m.vision);
  EXPECT_EQ(v["tower_params"].get<int64_t>(), tower);
  EXPECT_EQ(v["projector_params"].get<int64_t>(), projector);
  EXPECT_GT(v["weight_bytes"].get<double>(), 2.0 * static_cast<double>(tower + projector));
  EXPECT_GT(v["plan_work_bytes"].get<double>(), 0);
  EXPECT_EQ(v["reps"], 2);
  ASSERT_EQ(v["images"].size(), 2u);
  const json& photo = v["images"][0];
  EXPECT_EQ(photo["file"], cost_image("photo.jpg"));
  EXPECT_EQ(photo["format"], "JPEG");
  EXPECT_EQ(photo["width"], 640);
  EXPECT_EQ(photo["height"], 427);
  EXPECT_EQ(photo["grid"], json::array({32, 46}));
  EXPECT_EQ(photo["patches"], 32 * 46);
  EXPECT_EQ(photo["tokens"], 368);
  const json& tiny = v["images"][1];
  EXPECT_EQ(tiny["tokens"], 1);  // 20 x 9: smaller than one merge cell
  EXPECT_EQ(tiny["grid"], json::array({2, 2}));
  EXPECT_EQ(v["image_tokens"], 369);
  for (const auto& im : v["images"]) {
    EXPECT_GT(im["tower_s"]["median"].get<double>(), 0) << im.dump();
    EXPECT_LE(im["tower_s"]["min"].get<double>(), im["tower_s"]["max"].get<double>());
    EXPECT_GT(im["preprocess_s"]["median"].get<double>(), 0) << im.dump();
    EXPECT_GT(im["tower_flops"].get<double>(), 0);
    EXPECT_GT(im["work_bytes"].get<double>(), 0);
  }
  // More patches, more work and more working memory.
  EXPECT_GT(photo["tower_flops"].get<double>(), tiny["tower_flops"].get<double>());
  EXPECT_GT(photo["work_bytes"].get<double>(), tiny["work_bytes"].get<double>());
  // The plan's working memory is for the largest image the processor can make.
  EXPECT_GT(v["plan_work_bytes"].get<double>(), photo["work_bytes"].get<double>());
  EXPECT_GT(v["peak_rss_bytes"].get<double>(), 0);

  // The text report: one line for the tower, one per image; the HTML report: a row and a chart.
  const std::string report = test::temp_dir("vision-cost-report") + "/bench.html";
  const auto t =
      test::run_deltafin({"bench", "--model", m.vision, "--prompt-tokens", "8", "--gen-tokens", "2",
                          "--reps", "1", "--no-disk-probe", "--no-in-ram-reference", "--image",
                          cost_image("photo.jpg"), "--report", report});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  for (const char* s : {"prefill ", "decode ", "vision     tower ", "parameters",
                        "photo.jpg 640x427 -> 1472 patches (32x46) -> 368 image tokens: tower "})
    EXPECT_NE(t.out.find(s), std::string::npos) << s << "\n" << t.out;
  const std::string html = test::slurp(report);
  for (const char* s : {"<td>vision tower</td>", "1 image, 368 image tokens",
                        "Vision tower: seconds per image (median)", "photo.jpg (368 tokens)"})
    EXPECT_NE(html.find(s), std::string::npos) << s << "\n" << html;
}

TEST(VisionCost, BenchImageRefusesWhatItCannotMeasure) {
  const CostModels& m = cost_models();
  const std::string dir = test::temp_dir("vision-cost-bad");
  const std::string not_image = dir + "/notes.png";
  test::spit(not_image, "these are not pixels");
  struct Case {
    std::vector<std::string> args;
    std::string words;
  };
  const std::vector<Case> cases = {
      {{"--model", m.text, "--image", cost_image("photo.jpg")}, "has no vision tower"},
      {{"--model", m.vision, "--image", dir + "/missing.png"}, "missing.png"},
      {{"--model", m.vision, "--image", not_image}, "not a recognised image"},
      {{"--model", m.vision, "--image", cost_image("hostile_bomb.png")}, "178956970 pixels"},
      {{"--model", m.vision, "--image", cost_image("photo.jpg"), "--turns", "2"}, "--turns"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {
        "bench",           "--prompt-tokens",      "4", "--gen-tokens", "1", "--reps", "1",
        "--no-disk-probe", "--no-in-ram-reference"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(c.words);
    const auto r = test::run_deltafin(args);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
  // A truncated body passes the headers and fails in the tower's decode, naming the file.
  const auto r = test::run_deltafin(
      {"bench", "--model", m.vision, "--prompt-tokens", "4", "--gen-tokens", "1", "--reps", "1",
       "--no-disk-probe", "--no-in-ram-reference", "--image", cost_image("hostile_truncated.png")});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("hostile_truncated.png"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
}

// The value of an unlabelled sample in a /metrics body (-1 when absent).
double metric_value(const std::string& body, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = body.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(
      body.substr(at + key.size(), body.find('\n', at + key.size()) - at - key.size()));
}

json cost_chat(const std::string& url) {
  return {
      {"model", "kimi-k3"},
      {"max_tokens", 2},
      {"messages",
       json::array({{{"role", "user"},
                     {"content",
                      json::array({{{"type", "text"}, {"text", "What is this?"}},
                                   {{"type", "image_url"}, {"image_url", {{"url", url}}}}})}}})}};
}

TEST(VisionCost, MetricsCountImagesAndTheTower) {
  const CostModels& m = cost_models();
  test::ServerProcess srv({}, m.vision);
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const std::string photo =
      "data:image/jpeg;base64," + base64::encode(test::slurp(cost_image("photo.jpg")));
  const std::string tiny =
      "data:image/png;base64," + base64::encode(test::slurp(cost_image("tiny_20x9.png")));
  std::string body = test::get(*c, "/metrics").body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_images_encoded_total"), 0) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_prompt_images_total"), 0) << body;
  const auto [tower, projector] = expected_params(m.vision);
  EXPECT_EQ(metric_value(body, "deltafin_vision_tower_params"),
            static_cast<double>(tower + projector));
  EXPECT_GT(metric_value(body, "deltafin_vision_tower_bytes"), 2.0 * (tower + projector));
  EXPECT_GT(metric_value(body, "deltafin_vision_work_bytes"), 0);

  ASSERT_EQ(test::post_json(*c, "/v1/chat/completions", cost_chat(photo)).status, 200);
  ASSERT_EQ(test::post_json(*c, "/v1/chat/completions", cost_chat(tiny)).status, 200);
  // A refused image (its body is cut short) counts nothing.
  const std::string cut =
      "data:image/png;base64," + base64::encode(test::slurp(cost_image("hostile_truncated.png")));
  EXPECT_EQ(test::post_json(*c, "/v1/chat/completions", cost_chat(cut)).status, 400);
  body = test::get(*c, "/metrics").body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_prompt_images_total"), 2) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_prompt_image_tokens_total"), 368 + 1) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_images_encoded_total"), 2) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_image_tokens_encoded_total"), 368 + 1) << body;
  EXPECT_GT(metric_value(body, "deltafin_vision_seconds_total"), 0) << body;
  for (const char* k : {"# TYPE deltafin_vision_images_encoded_total counter",
                        "# TYPE deltafin_vision_tower_bytes gauge"})
    EXPECT_NE(body.find(k), std::string::npos) << k;
  // The same image sent again lies in the kept state: counted, not encoded. The log line of
  // each request says how many images it had and how many the tower encoded.
  ASSERT_EQ(test::post_json(*c, "/v1/chat/completions", cost_chat(tiny)).status, 200);
  body = test::get(*c, "/metrics").body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_prompt_images_total"), 3) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_images_encoded_total"), 2) << body;
  const std::regex line(R"(\[serve\] [^\n]* 200 [^\n]*cached[^\n]*, 1 image \((\d) encoded in )");
  std::vector<std::string> encoded;
  for (int i = 0; i < 200 && encoded.size() < 3; ++i) {
    encoded.clear();
    const std::string err = srv.err();
    for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator();
         ++it)
      encoded.push_back((*it)[1].str());
    if (encoded.size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(encoded, (std::vector<std::string>{"1", "1", "0"})) << srv.err();

  // A text-only model reports no tower.
  test::ServerProcess text({}, m.text);
  ASSERT_TRUE(text.ready()) << text.err();
  auto tc = text.client();
  body = test::get(*tc, "/metrics").body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_tower_bytes"), 0) << body;
  EXPECT_EQ(metric_value(body, "deltafin_vision_tower_params"), 0) << body;
}

TEST(VisionCost, ThePlanCountsTheTowerAsResident) {
  const CostModels& m = cost_models();
  // run -v prints the plan with the tower's line.
  const auto r = test::run_deltafin({"run", "--model", m.vision, "-v", "--prompt-ids", "1,2,3",
                                     "--max-new", "1", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[plan] vision tower + projector:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("never streamed"), std::string::npos) << r.err;
  const auto t = test::run_deltafin({"run", "--model", m.text, "-v", "--prompt-ids", "1,2,3",
                                     "--max-new", "1", "--temperature", "0"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.err.find("[plan] vision"), std::string::npos) << t.err;

  // doctor --model: the same text model with and without the tower plans the same but for the
  // tower's weights and working memory, which the fixed costs and the minimum working set carry.
  auto doctor = [](const std::string& model) {
    const auto d = test::run_deltafin({"doctor", "--model", model, "--json", "--threads", "1",
                                       "--memory-budget", "2G", "--prompt-tokens", "16"});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    return json::parse(d.out);
  };
  const json dv = doctor(m.vision), dt = doctor(m.text);
  const json& pv = dv["plan"];
  const json& pt = dt["plan"];
  const uint64_t w = pv["vision_weight_bytes"], work = pv["vision_work_bytes"];
  EXPECT_GT(w, 0u);
  EXPECT_GT(work, 0u);
  EXPECT_EQ(pt["vision_weight_bytes"], 0);
  EXPECT_EQ(pv["fixed_bytes"].get<uint64_t>(), pt["fixed_bytes"].get<uint64_t>() + w + work);
  EXPECT_EQ(pv["min_working_set_bytes"].get<uint64_t>(),
            pt["min_working_set_bytes"].get<uint64_t>() + w + work);
  // doctor's vision section for the checkpoint: its own tower and processor.
  const json& v = dv["vision"];
  const auto [tower, projector] = expected_params(m.vision);
  EXPECT_EQ(v["tower_params"].get<int64_t>(), tower);
  EXPECT_EQ(v["projector_params"].get<int64_t>(), projector);
  EXPECT_EQ(v["weight_bytes"], w);
  EXPECT_NE(v["media_proc_cfg"].get<std::string>().find("preprocessor_config.json"),
            std::string::npos);
  ASSERT_EQ(v["images"].size(), 3u);
  EXPECT_GT(v["images"][0]["forecast_s"].get<double>(), 0);
  EXPECT_FALSE(dt.contains("vision"));
}

// The plan sizes the tower's working memory by vision::max_patches: no image size exceeds it.
TEST(VisionCost, MaxPatchesBoundsEveryImage) {
  const vision::MediaProcConfig cfg = vision::release_media_proc_config();
  const int64_t bound = vision::max_patches(cfg);
  EXPECT_EQ(bound, kReleaseVisionMaxPatches);
  int64_t most = 0;
  auto check = [&](int64_t w, int64_t h) {
    const vision::ImagePlan p = vision::plan_image(w, h, cfg);
    most = std::max(most, p.patches());
    EXPECT_LE(p.patches(), bound) << w << "x" << h;
  };
  // The documented worst cases (docs/VISION.md §3.3) and the edges of the rule.
  for (auto [w, h] : std::vector<std::pair<int64_t, int64_t>>{{1861, 7041},
                                                              {7041, 1861},
                                                              {3600, 3600},
                                                              {8000, 8000},
                                                              {100000, 1},
                                                              {1, 100000},
                                                              {7168, 7168},
                                                              {3583, 3583}})
    check(w, h);
  std::mt19937_64 rng(38);
  std::uniform_int_distribution<int64_t> side(1, 20000);
  for (int i = 0; i < 20000; ++i) check(side(rng), side(rng));
  // Sizes just under a patch multiple, where the rule's divisions inflate most.
  for (int64_t k = 120; k <= 520; ++k) check(14 * k + 13, 14 * ((65536 + k - 1) / k) + 13);
  EXPECT_GE(most, 66564);  // 3600 x 3600 reaches past the budget
}

}  // namespace
}  // namespace deltafin
