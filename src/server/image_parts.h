// Images at the server's edge: every API's image (an OpenAI `image_url` part, a Responses
// `input_image`, an Anthropic `image` block, an Ollama `images` string) is checked here, on the
// HTTP thread, before the request is queued, and becomes the one internal form the chat renderer
// reads: an OpenAI part {"type":"image_url","image_url":{"url":"data:<mime>;base64,<data>"}}.
//
// Why it is built this way:
// - An image is hostile until checked, and a bad one must be one clear 400 that names the part
//   in the client's own terms ("messages[1].content[0].image_url"), never a failure deep in the
//   engine after the stream has started. So each translator checks its images with its own paths
//   (ImageGate), and what reaches parse_chat_request is already a checked data URL.
// - The edge reads headers, never pixels: the declared MIME type must be one of PNG, JPEG, WebP,
//   GIF and agree with the bytes, the base64 must be canonical, the decoded size is capped
//   (ImagePolicy::max_bytes), and vision::probe_image checks the header against the limits (a
//   30000 × 30000 header or a decompression bomb costs nothing). A text-only model's server
//   (ImagePolicy::text_only) then refuses the image, naming the part, without decoding it. On a
//   model with a tower the image is decoded once, by the encoder, when its sequence starts
//   (runtime/images.h); a file whose body is truncated or corrupt is refused there, still before
//   any response byte, with the same 400 naming the same part: each internal part carries the
//   client's path (kPartPathKey), which becomes the image's name in the prompt, so the engine's
//   errors speak the client's terms (docs/VISION.md §11.7).
// - The server fetches nothing a client names unless `serve --allow-image-urls` (ImagePolicy::
//   allow_urls): then http(s) only, under a deadline and the same size cap (image_fetch.h), and
//   the fetched bytes pass the same checks and become a data URL, so the renderer never sees a
//   remote URL.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat.h"

namespace deltafin::server {

struct ImagePolicy {
  bool allow_urls = false;                  // serve --allow-image-urls
  uint64_t max_bytes = uint64_t{20} << 20;  // decoded bytes of one image (serve --max-image-bytes)
  int max_images = 100;                     // images in one request (Anthropic's own limit)
  double fetch_seconds = 15;                // deadline of one URL fetch, connecting included
  // The model has no vision tower: each image is checked (headers) and refused, naming its part.
  bool text_only = false;
  // Set by the translators on the request they hand to parse_chat_request: its image parts are
  // data URLs this gate made, so they are not decoded a second time.
  bool checked = false;
};

// The images of one request: each call checks one image (400 naming `path` when it is bad) and
// counts it against ImagePolicy::max_images.
class ImageGate {
 public:
  explicit ImageGate(const ImagePolicy& policy) : policy_(policy) {}

  // A `data:` URL or, when allowed, an http(s) URL: the checked data URL (the MIME type written
  // as the bytes' own, lower case).
  std::string from_url(const std::string& url, const std::string& path);
  // Base64 data with a declared MIME type (Anthropic), or none (Ollama: the bytes say which).
  std::string from_base64(const std::string& mime, const std::string& data, const std::string& path,
                          const std::string& mime_path);
  // The internal part for a checked data URL: the image_url part, with the client's path of the
  // image under kPartPathKey (the engine names the image so in its errors).
  static nlohmann::ordered_json part(const std::string& data_url, const std::string& path);

  int count() const { return count_; }

 private:
  void count_one(const std::string& path);
  std::string checked_bytes(const std::string& declared_mime, const std::string& bytes,
                            const std::string& path);

  const ImagePolicy& policy_;
  int count_ = 0;
};

// The internal part's key for the client's path of its image. A client cannot set it: the gate
// refuses unknown keys of an OpenAI image part, and the translators write every part themselves.
inline constexpr const char* kPartPathKey = "deltafin_client_path";

// After ChatRequest::from_json: each image of `messages` whose internal part (in `body`, the chat
// body that was parsed) carries kPartPathKey takes that path as its name.
void name_images_by_client_path(const nlohmann::ordered_json& body,
                                std::vector<ChatMessage>& messages);

// /v1/chat/completions: checks every image_url part of `body`'s messages in place (each becomes
// the normalised {"type":"image_url","image_url":{"url": checked data URL}}). Nothing to do when
// policy.checked. Throws ApiError 400 naming the part.
void check_chat_images(nlohmann::ordered_json& body, const ImagePolicy& policy);

}  // namespace deltafin::server
