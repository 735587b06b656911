// Images through every server API (src/server/image_parts.*, image_fetch.*): the translators'
// image parts, and hostile images against the real `deltafin serve`.
//
// Why it is built this way:
// - One table of hostile images (the files of tests/data/vision the decoder tests use, a real
//   decompression bomb made here with zlib, and malformed data URLs and base64), each sent through
//   every API that can carry it — OpenAI chat, Responses, Anthropic Messages, Ollama /api/chat
//   and /api/generate — so a refusal is checked where clients meet it: one 400 whose body names
//   the part in that API's own terms, and the server healthy afterwards. The table runs against a
//   model with a tower (the edge reads headers, the encoder decodes each image once when its
//   sequence starts) and against a text-only model (the edge reads headers and refuses, never
//   decoding: kinds whose fault is in the body get the text-only refusal).
// - Remote URLs are fetched from a loopback httplib server started here (no network), for the
//   paths a hostile host can take: a redirect to file:, a body over the cap, a 404, non-image
//   bytes.
// - Until the chat renderer takes image parts (the vision-prompt work), a good image passes the
//   gate and is then refused by the renderer ("only text content ... image_url"), which shows the
//   translation produced the internal image_url part. kRendererTakesImages = true turns the same
//   tests into the end-to-end ones: every API answers the image with 200.
#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include <functional>
#include <thread>

#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/image_parts.h"
#include "server/responses_api.h"
#include "server_util.h"
#include "test_util.h"
#include "tokenizer/base64.h"

namespace deltafin::server {
namespace {

using json = nlohmann::ordered_json;
using test::HttpResult;
using test::ServerProcess;

// Flip when the chat renderer accepts image parts: the good-image tests then expect answers.
constexpr bool kRendererTakesImages = true;

// The tiny synthetic model with a tiny vision tower of the released structure (made once): what
// the good-image tests serve, so they answer images once the renderer places them.
const std::string& vapi_vision_model() {
  static const std::string dir =
      test::shared_model({"--preset", "tiny", "--vision", "tiny", "--quiet"});
  return dir;
}

std::string vapi_file(const std::string& rel) {
  return test::slurp(test::data_dir() + "/vision/" + rel);
}

std::string vapi_b64(const std::string& bytes) {
  return base64::encode(bytes);
}

// A PNG chunk: length, type, data, CRC-32 of type and data.
std::string vapi_chunk(const std::string& type, const std::string& data) {
  std::string out;
  const auto n = static_cast<uint32_t>(data.size());
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  const std::string body = type + data;
  out += body;
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((crc >> s) & 0xff));
  return out;
}

// A real decompression bomb: a well-formed 1-bit grey PNG of 14000 × 14000 pixels (196 M, over
// the vision layer's 178,956,970-pixel limit) whose rows are all zero, so the file is tiny.
std::string vapi_bomb_png() {
  const uint32_t side = 14000;
  std::string ihdr;
  for (int k = 0; k < 2; ++k)
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(static_cast<char>((side >> s) & 0xff));
  ihdr += std::string("\x01\x00\x00\x00\x00", 5);  // depth 1, grey, deflate, filter 0, no interlace
  const size_t raw_size = size_t{side} * (1 + (side + 7) / 8);
  const std::string raw(raw_size, '\0');
  uLongf packed_size = compressBound(static_cast<uLong>(raw_size));
  std::string packed(packed_size, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                      reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw_size), 9),
            Z_OK);
  packed.resize(packed_size);
  return std::string("\x89PNG\r\n\x1a\n", 8) + vapi_chunk("IHDR", ihdr) +
         vapi_chunk("IDAT", packed) + vapi_chunk("IEND", "");
}

// One hostile image: as a data URL (OpenAI, Responses) and, where it is base64 with a MIME type,
// as an Anthropic base64 source and an Ollama images entry.
struct HostileImage {
  std::string kind;
  std::string url;        // what OpenAI and Responses send
  std::string mime;       // Anthropic's media_type ("" when the kind is not a base64 image)
  std::string data;       // Anthropic's data and Ollama's entry
  std::string words;      // in the error
  bool ollama = true;     // meaningful without a MIME type (Ollama sends bytes only)
  bool anthropic = true;  // expressible as an Anthropic source
  // Its headers are sound; only decoding its body finds the fault (the encoder, on a model with
  // a tower; a text-only model's edge refuses it as an image before, without decoding it).
  bool body_fault = false;
};

HostileImage base64_kind(const std::string& kind, const std::string& mime, const std::string& data,
                         const std::string& words, bool ollama = true) {
  return {kind, "data:" + mime + ";base64," + data, mime, data, words, ollama, true};
}

HostileImage body_fault(HostileImage h) {
  h.body_fault = true;
  return h;
}

std::vector<HostileImage> hostile_images() {
  const std::string png = "image/png";
  const std::string photo = vapi_b64(vapi_file("photo.jpg"));
  std::vector<HostileImage> v = {
      base64_kind("truncated PNG", png, vapi_b64(vapi_file("hostile_truncated.png")), "truncated"),
      base64_kind("zero width", png, vapi_b64(vapi_file("hostile_zero_width.png")),
                  "positive width and height"),
      base64_kind("30000x30000 header", png, vapi_b64(vapi_file("hostile_bomb.png")),
                  "178956970 pixels"),
      base64_kind("decompression bomb", png, vapi_b64(vapi_bomb_png()), "178956970 pixels"),
      base64_kind("GIF screen bomb", "image/gif", vapi_b64(vapi_file("decode/bomb.gif")),
                  "30000x30000"),
      body_fault(base64_kind("corrupt PNG data", png, vapi_b64(vapi_file("decode/bad_idat.png")),
                             "PNG image data")),
      body_fault(base64_kind("truncated JPEG", "image/jpeg",
                             vapi_b64(vapi_file("decode/truncated.jpg")), "truncated")),
      base64_kind("CMYK JPEG", "image/jpeg", vapi_b64(vapi_file("decode/cmyk.jpg")), "CMYK"),
      base64_kind("wrong MIME vs bytes", png, photo,
                  "declared as image/png but the bytes are a JPEG", false),
      base64_kind("non-image bytes", png, vapi_b64(vapi_file("hostile_not_image.png")),
                  "not a recognised image"),
      base64_kind("BMP bytes", png, vapi_b64(vapi_file("decode/image.bmp")), "BMP"),
      base64_kind("bad base64", png, "iVBORw0KGgo!!!!", "not well-formed base64"),
      base64_kind("base64 with a line break", png, photo.substr(0, 76) + "\n" + photo.substr(76),
                  "not well-formed base64"),
      base64_kind("empty data", png, "", "empty"),
      base64_kind("unsupported MIME", "image/tiff", vapi_b64(std::string("II*\0\x08\0\0\0", 8)),
                  "image/tiff", false),
      base64_kind("over the size cap", png, std::string(100000, 'A'), "over the server's limit"),
      base64_kind("SVG", "image/svg+xml",
                  vapi_b64("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"9\" height=\"9\"/>"),
                  "SVG", false),
  };
  v.push_back({"data URL without ;base64", "data:image/png,%89PNG", "", "", "no ;base64 marker",
               false, false});
  v.push_back({"data URL without MIME type", "data:;base64," + photo, "", "",
               "MIME type is missing", false, false});
  v.push_back({"remote URL without the flag", "https://example.com/cat.png", "", "",
               "--allow-image-urls", false, false});
  v.push_back({"file URL", "file:///etc/passwd", "", "", "the scheme \"file:\"", false, false});
  return v;
}

json vapi_openai(const std::string& url) {
  return {{"model", "kimi-k3"},
          {"max_tokens", 4},
          {"messages",
           json::array({{{"role", "user"},
                         {"content",
                          json::array({{{"type", "text"}, {"text", "What is this?"}},
                                       {{"type", "image_url"},
                                        {"image_url", {{"url", url}, {"detail", "low"}}}}})}}})}};
}

json vapi_responses(const std::string& url) {
  return {
      {"model", "kimi-k3"},
      {"max_output_tokens", 4},
      {"input",
       json::array({{{"role", "user"},
                     {"content", json::array({{{"type", "input_text"}, {"text", "What is this?"}},
                                              {{"type", "input_image"}, {"image_url", url}}})}}})}};
}

json vapi_anthropic(const json& source) {
  return {{"model", "kimi-k3"},
          {"max_tokens", 4},
          {"messages",
           json::array({{{"role", "user"},
                         {"content", json::array({{{"type", "text"}, {"text", "What is this?"}},
                                                  {{"type", "image"}, {"source", source}}})}}})}};
}

json vapi_ollama_chat(const std::string& data) {
  return {
      {"model", "kimi-k3"},
      {"stream", false},
      {"options", {{"num_predict", 4}}},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", "What is this?"}, {"images", json::array({data})}}})}};
}

json vapi_ollama_generate(const std::string& data) {
  return {{"model", "kimi-k3"},
          {"stream", false},
          {"options", {{"num_predict", 4}}},
          {"prompt", "What is this?"},
          {"images", json::array({data})}};
}

struct Sent {
  std::string api, path, param;
  json body;
};

std::vector<Sent> requests_for(const HostileImage& h) {
  std::vector<Sent> out;
  out.push_back(
      {"openai", "/v1/chat/completions", "messages[0].content[1].image_url", vapi_openai(h.url)});
  out.push_back(
      {"responses", "/v1/responses", "input[0].content[1].image_url", vapi_responses(h.url)});
  if (h.anthropic) {
    out.push_back({"anthropic", "/v1/messages", "messages[0].content[1].source",
                   vapi_anthropic({{"type", "base64"}, {"media_type", h.mime}, {"data", h.data}})});
  } else if (h.url.rfind("data:", 0) != 0) {
    out.push_back({"anthropic url", "/v1/messages", "messages[0].content[1].source",
                   vapi_anthropic({{"type", "url"}, {"url", h.url}})});
  }
  if (h.ollama) {
    out.push_back({"ollama chat", "/api/chat", "messages[0].images[0]", vapi_ollama_chat(h.data)});
    out.push_back({"ollama generate", "/api/generate", "images[0]", vapi_ollama_generate(h.data)});
  }
  return out;
}

// The error message of any of the APIs' error shapes.
std::string error_message(const HttpResult& r) {
  if (!r.j.is_object()) return "";
  const json& e = r.j.contains("error") ? r.j["error"] : json();
  if (e.is_string()) return e.get<std::string>();  // Ollama
  if (e.is_object() && e.contains("message")) return e["message"].get<std::string>();
  return "";
}

void expect_healthy(ServerProcess& srv) {
  auto c = srv.client();
  const HttpResult h = test::get(*c, "/health");
  EXPECT_EQ(h.status, 200) << h.body;
}

// The refusal a text-only model's edge gives an image whose headers pass.
constexpr const char* kTextOnlyWords = "this model is text only";

// Every hostile image through every API against `srv`: one 400 naming the part in the client's
// terms, with `words_of(h)` in it, and the server healthy after each. Returns the requests sent.
int send_hostile_images(ServerProcess& srv,
                        const std::function<std::string(const HostileImage&)>& words_of) {
  auto c = srv.client();
  int sent = 0;
  for (const HostileImage& h : hostile_images()) {
    for (const Sent& s : requests_for(h)) {
      SCOPED_TRACE(h.kind + " via " + s.api);
      const HttpResult r = test::post_json(*c, s.path, s.body);
      EXPECT_EQ(r.status, 400) << r.body;
      const std::string msg = error_message(r);
      EXPECT_EQ(msg.rfind(s.param, 0), 0u) << "names the part first: " << r.body;
      EXPECT_NE(msg.find(words_of(h)), std::string::npos) << r.body;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << r.body;
      if (s.api == "openai" || s.api == "responses") {
        EXPECT_EQ(r.j["error"]["param"].get<std::string>().rfind(s.param, 0), 0u) << r.body;
      }
      expect_healthy(srv);
      ++sent;
    }
  }
  return sent;
}

// A model with a tower: the edge reads headers, the encoder decodes (once) when the sequence
// starts; either way the refusal is the same 400 naming the part.
TEST(VisionApi, HostileImagesGiveOneClear400ThroughEveryApi) {
  ServerProcess srv({"--max-image-bytes", "64K"}, vapi_vision_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const int sent = send_hostile_images(srv, [](const HostileImage& h) { return h.words; });
  EXPECT_GT(sent, 4 * 12);
  // A refused image is not counted as encoded.
  const HttpResult m = test::get(*c, "/metrics");
  EXPECT_NE(m.body.find("\ndeltafin_vision_images_encoded_total 0\n"), std::string::npos) << m.body;
  // And a text request still answers on every API.
  EXPECT_EQ(test::post_json(*c, "/v1/chat/completions",
                            {{"model", "kimi-k3"},
                             {"max_tokens", 2},
                             {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}})
                .status,
            200);
  EXPECT_EQ(test::post_json(*c, "/api/chat",
                            {{"model", "kimi-k3"},
                             {"stream", false},
                             {"options", {{"num_predict", 2}}},
                             {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}})
                .status,
            200);
  EXPECT_TRUE(srv.running());
}

// A text-only model: the edge checks the headers (every kind its headers show is refused for
// that) and refuses the rest as images this model cannot take, without decoding them — the
// kinds whose fault lies in the body get the text-only refusal, which proves no decode ran.
TEST(VisionApi, TextOnlyModelProbesImagesAndRefusesThem) {
  ServerProcess srv({"--max-image-bytes", "64K"});
  ASSERT_TRUE(srv.ready()) << srv.err();
  const int sent = send_hostile_images(
      srv, [](const HostileImage& h) { return h.body_fault ? kTextOnlyWords : h.words; });
  EXPECT_GT(sent, 4 * 12);
  // A good image: the same refusal, naming the part, through every API.
  auto c = srv.client();
  const std::string b64 = vapi_b64(vapi_file("photo.jpg"));
  const std::string url = "data:image/jpeg;base64," + b64;
  const std::vector<Sent> good = {
      {"openai", "/v1/chat/completions", "messages[0].content[1].image_url", vapi_openai(url)},
      {"responses", "/v1/responses", "input[0].content[1].image_url", vapi_responses(url)},
      {"anthropic", "/v1/messages", "messages[0].content[1].source",
       vapi_anthropic({{"type", "base64"}, {"media_type", "image/jpeg"}, {"data", b64}})},
      {"ollama chat", "/api/chat", "messages[0].images[0]", vapi_ollama_chat(b64)},
      {"ollama generate", "/api/generate", "images[0]", vapi_ollama_generate(b64)},
  };
  for (const Sent& s : good) {
    SCOPED_TRACE(s.api);
    const HttpResult r = test::post_json(*c, s.path, s.body);
    EXPECT_EQ(r.status, 400) << r.body;
    const std::string msg = error_message(r);
    EXPECT_EQ(msg.rfind(s.param, 0), 0u) << r.body;
    EXPECT_NE(msg.find(kTextOnlyWords), std::string::npos) << r.body;
  }
  expect_healthy(srv);
}

// Structural refusals of image parts, each naming its field.
TEST(VisionApi, MalformedImagePartsNameTheirField) {
  // A model with a tower: a text-only model refuses the first image before a 101st is counted.
  ServerProcess srv({}, vapi_vision_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const std::string png = "data:image/png;base64," + vapi_b64(vapi_file("tiny_20x9.png"));
  struct Case {
    std::string path;
    json body;
    std::string param, words;
  };
  json extra = vapi_openai(png);
  extra["messages"][0]["content"][1]["image_url"]["fidelity"] = 1;
  json bad_detail = vapi_openai(png);
  bad_detail["messages"][0]["content"][1]["image_url"]["detail"] = "ultra";
  json file_id = vapi_responses(png);
  file_id["input"][0]["content"][1] = {{"type", "input_image"}, {"file_id", "file-1"}};
  json input_file = vapi_responses(png);
  input_file["input"][0]["content"][1] = {{"type", "input_file"}, {"file_id", "file-1"}};
  json document = vapi_anthropic({});
  document["messages"][0]["content"][1] = {
      {"type", "document"},
      {"source", {{"type", "base64"}, {"media_type", "application/pdf"}, {"data", "JVBERi0="}}}};
  json ollama_assistant = vapi_ollama_chat(vapi_b64(vapi_file("tiny_20x9.png")));
  ollama_assistant["messages"][0]["role"] = "assistant";
  json raw = vapi_ollama_generate(vapi_b64(vapi_file("tiny_20x9.png")));
  raw["raw"] = true;
  json too_many = vapi_openai(png);
  for (int i = 0; i < 100; ++i)
    too_many["messages"][0]["content"].push_back(too_many["messages"][0]["content"][1]);
  const std::vector<Case> cases = {
      {"/v1/chat/completions", extra, "messages[0].content[1].image_url.fidelity", "not supported"},
      {"/v1/chat/completions", bad_detail, "messages[0].content[1].image_url.detail", "auto"},
      {"/v1/chat/completions", too_many, "messages[0].content[101].image_url", "more than 100"},
      {"/v1/responses", file_id, "input[0].content[1].file_id", "Files API"},
      {"/v1/responses", input_file, "input[0].content[1].type", "input_file"},
      {"/v1/messages", vapi_anthropic({{"type", "file"}, {"file_id", "f"}}),
       "messages[0].content[1].source.type", "Files API"},
      {"/v1/messages", document, "messages[0].content[1].type", "document"},
      {"/api/chat", ollama_assistant, "messages[0].images", "user messages only"},
      {"/api/generate", raw, "images", "raw"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.param);
    const HttpResult r = test::post_json(*c, k.path, k.body);
    EXPECT_EQ(r.status, 400) << r.body;
    const std::string msg = error_message(r);
    EXPECT_EQ(msg.rfind(k.param, 0), 0u) << r.body;
    EXPECT_NE(msg.find(k.words), std::string::npos) << r.body;
  }
  expect_healthy(srv);
}

// A good image through each API: past the gate (and, with the renderer's image support, answered).
void expect_image_taken(const HttpResult& r, const std::string& api) {
  SCOPED_TRACE(api);
  if (kRendererTakesImages) {
    EXPECT_EQ(r.status, 200) << r.body;
    return;
  }
  // The renderer's refusal of the internal part: the gate accepted the image and the translator
  // wrote it as an image_url part.
  EXPECT_EQ(r.status, 400) << r.body;
  const std::string msg = error_message(r);
  EXPECT_NE(msg.find("only text content"), std::string::npos) << r.body;
  EXPECT_NE(msg.find("image_url"), std::string::npos) << r.body;
}

TEST(VisionApi, GoodImagesPassEveryApi) {
  ServerProcess srv({}, vapi_vision_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  for (const char* file : {"tiny_20x9.png", "photo.jpg", "image.webp", "anim.gif"}) {
    SCOPED_TRACE(file);
    const std::string bytes = vapi_file(file);
    const std::string b64 = vapi_b64(bytes);
    const std::string ext = std::string(file).substr(std::string(file).rfind('.') + 1);
    const std::string mime = ext == "jpg" ? "image/jpeg" : "image/" + ext;
    const std::string url = "data:" + mime + ";base64," + b64;
    expect_image_taken(test::post_json(*c, "/v1/chat/completions", vapi_openai(url)), "openai");
    expect_image_taken(test::post_json(*c, "/v1/responses", vapi_responses(url)), "responses");
    expect_image_taken(
        test::post_json(*c, "/v1/messages",
                        vapi_anthropic({{"type", "base64"}, {"media_type", mime}, {"data", b64}})),
        "anthropic");
    expect_image_taken(test::post_json(*c, "/api/chat", vapi_ollama_chat(b64)), "ollama chat");
    expect_image_taken(test::post_json(*c, "/api/generate", vapi_ollama_generate(b64)),
                       "ollama generate");
  }
  expect_healthy(srv);
}

// The translators' output: the internal image_url data-URL part, in the client's order.
TEST(VisionApi, TranslatorsWriteTheInternalPart) {
  const std::string b64 = vapi_b64(vapi_file("tiny_20x9.png"));
  const std::string url = "data:image/png;base64," + b64;
  // The internal part, carrying the client's path of the image (errors name it so).
  auto part_at = [&](const std::string& path) {
    return json{{"type", "image_url"}, {"image_url", {{"url", url}}}, {kPartPathKey, path}};
  };
  const json part = part_at("messages[0].content[1].source");

  const json a = anthropic_to_chat(
      vapi_anthropic({{"type", "base64"}, {"media_type", "image/png"}, {"data", b64}}), false);
  ASSERT_EQ(a["messages"][0]["content"].size(), 2u) << a.dump();
  EXPECT_EQ(a["messages"][0]["content"][0]["text"], "What is this?");
  EXPECT_EQ(a["messages"][0]["content"][1], part);

  const json r = responses_to_chat(vapi_responses(url));
  ASSERT_EQ(r["messages"][0]["content"].size(), 2u) << r.dump();
  EXPECT_EQ(r["messages"][0]["content"][1], part_at("input[0].content[1].image_url"));

  // OpenAI: image/jpg is written image/jpeg, detail dropped (accepted and ignored).
  const std::string jpg = vapi_b64(vapi_file("photo.jpg"));
  json body = vapi_openai("data:image/jpg;base64," + jpg);
  check_chat_images(body, ImagePolicy{});
  EXPECT_EQ(body["messages"][0]["content"][1],
            (json{{"type", "image_url"},
                  {"image_url", {{"url", "data:image/jpeg;base64," + jpg}}},
                  {kPartPathKey, "messages[0].content[1].image_url"}}));
  // OpenAI's body may also hold the renderer's {"type": "image"} form: it passes the same gate.
  json image_form = vapi_openai(url);
  image_form["messages"][0]["content"][1] = {{"type", "image"}, {"url", url}};
  check_chat_images(image_form, ImagePolicy{});
  EXPECT_EQ(image_form["messages"][0]["content"][1], part_at("messages[0].content[1].url"));
  image_form["messages"][0]["content"][1] = {{"type", "image"}, {"url", "data:image/png;base64,"}};
  EXPECT_THROW(check_chat_images(image_form, ImagePolicy{}), ApiError);
  // A client cannot set the path key itself.
  json forged = vapi_openai(url);
  forged["messages"][0]["content"][1][kPartPathKey] = "x";
  EXPECT_THROW(check_chat_images(forged, ImagePolicy{}), ApiError);

  // A tool result carrying a screenshot (Claude Code's Read of an image) keeps it as a part.
  json tool = {
      {"model", "kimi-k3"},
      {"max_tokens", 4},
      {"messages",
       json::array({{{"role", "user"}, {"content", "look"}},
                    {{"role", "assistant"},
                     {"content", json::array({{{"type", "tool_use"},
                                               {"id", "t1"},
                                               {"name", "read"},
                                               {"input", json::object()}}})}},
                    {{"role", "user"},
                     {"content",
                      json::array({{{"type", "tool_result"},
                                    {"tool_use_id", "t1"},
                                    {"content", json::array({{{"type", "text"}, {"text", "a.png"}},
                                                             {{"type", "image"},
                                                              {"source",
                                                               {{"type", "base64"},
                                                                {"media_type", "image/png"},
                                                                {"data", b64}}}}})}}})}}})}};
  const json t = anthropic_to_chat(tool, false);
  const json& tm = t["messages"][2];
  EXPECT_EQ(tm["role"], "tool");
  ASSERT_TRUE(tm["content"].is_array()) << t.dump();
  EXPECT_EQ(tm["content"][0]["text"], "a.png");
  EXPECT_EQ(tm["content"][1], part_at("messages[2].content[0].content[1].source"));

  // No images: the text stays a string, as before.
  const json plain = anthropic_to_chat(
      {{"model", "kimi-k3"},
       {"max_tokens", 4},
       {"messages",
        json::array(
            {{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}})}},
      false);
  EXPECT_TRUE(plain["messages"][0]["content"].is_array());
}

// --allow-image-urls: fetched from a loopback server; every hostile answer is one 400.
TEST(VisionApi, RemoteImageUrlsAreFetchedOnlyWhenAllowed) {
  const std::string png = vapi_file("tiny_20x9.png");
  httplib::Server host;
  host.Get("/ok.png", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(png, "image/png");
  });
  host.Get("/to-file", [](const httplib::Request&, httplib::Response& res) {
    res.status = 302;
    res.set_header("Location", "file:///etc/passwd");
  });
  host.Get("/to-ok", [](const httplib::Request&, httplib::Response& res) {
    res.status = 302;
    res.set_header("Location", "/ok.png");
  });
  host.Get("/big", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(200000, 'x'), "image/png");
  });
  host.Get("/text", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("hello", "text/plain");
  });
  const int port = host.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  // Bound already: connections wait in the backlog until the accept loop runs.
  std::thread host_thread([&] { host.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);

  // The library path: the fetched bytes become a data URL.
  ImagePolicy allow;
  allow.allow_urls = true;
  json body = vapi_openai(base + "/to-ok");
  check_chat_images(body, allow);
  EXPECT_EQ(body["messages"][0]["content"][1]["image_url"]["url"],
            "data:image/png;base64," + vapi_b64(png));

  {
    ServerProcess off({});
    ASSERT_TRUE(off.ready()) << off.err();
    auto c = off.client();
    const HttpResult r = test::post_json(*c, "/v1/chat/completions", vapi_openai(base + "/ok.png"));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(error_message(r).find("--allow-image-urls"), std::string::npos) << r.body;
  }
  ServerProcess srv({"--allow-image-urls", "--max-image-bytes", "64K"}, vapi_vision_model());
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  expect_image_taken(test::post_json(*c, "/v1/chat/completions", vapi_openai(base + "/ok.png")),
                     "openai url");
  expect_image_taken(test::post_json(*c, "/v1/messages",
                                     vapi_anthropic({{"type", "url"}, {"url", base + "/to-ok"}})),
                     "anthropic url");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/to-file", "scheme other than http(s)"},
      {"/big", "over the server's limit"},
      {"/missing", "HTTP 404"},
      {"/text", "not a recognised image"},
  };
  for (const auto& [route, words] : bad) {
    SCOPED_TRACE(route);
    const HttpResult r = test::post_json(*c, "/v1/chat/completions", vapi_openai(base + route));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j["error"]["param"], "messages[0].content[1].image_url") << r.body;
    EXPECT_NE(error_message(r).find(words), std::string::npos) << r.body;
    expect_healthy(srv);
  }
  host.stop();
  host_thread.join();
}

}  // namespace
}  // namespace deltafin::server
