// The image gate (see image_parts.h).
#include "server/image_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <span>

#include "core/error.h"
#include "server/api_error.h"
#include "server/image_fetch.h"
#include "tokenizer/base64.h"
#include "vision/image.h"

namespace deltafin::server {

using json = nlohmann::ordered_json;

namespace {

std::string lower_ascii(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool has_prefix_nocase(const std::string& s, const char* prefix) {
  const std::string p(prefix);
  return s.size() >= p.size() && lower_ascii(s.substr(0, p.size())) == p;
}

const char* image_mime_of(vision::ImageFormat f) {
  switch (f) {
    case vision::ImageFormat::kPng:
      return "image/png";
    case vision::ImageFormat::kJpeg:
      return "image/jpeg";
    case vision::ImageFormat::kGif:
      return "image/gif";
    case vision::ImageFormat::kWebp:
      return "image/webp";
  }
  return "image/png";
}

// The declared MIME type as one of the four accepted (lower case; image/jpg is image/jpeg), or a
// 400 naming `path` that says what is accepted.
std::string accepted_mime(const std::string& declared, const std::string& path) {
  const std::string m = lower_ascii(declared);
  if (m == "image/png" || m == "image/jpeg" || m == "image/webp" || m == "image/gif") return m;
  if (m == "image/jpg") return "image/jpeg";
  if (m.empty()) {
    bad_request(path,
                "{}: the MIME type is missing (image/png, image/jpeg, image/webp or image/gif)",
                path);
  }
  if (m == "image/svg+xml" || m == "image/svg") {
    bad_request(path,
                "{}: SVG images are not supported (a vector image is not pixels; send image/png, "
                "image/jpeg, image/webp or image/gif)",
                path);
  }
  bad_request(path,
              "{}: the MIME type \"{}\" is not supported (image/png, image/jpeg, image/webp or "
              "image/gif)",
              path, declared.size() > 100 ? declared.substr(0, 100) + "..." : declared);
}

// Base64 characters that decode to at most `max_bytes` (padded groups of 4).
uint64_t base64_chars_for(uint64_t max_bytes) {
  return (max_bytes + 2) / 3 * 4;
}

}  // namespace

void ImageGate::count_one(const std::string& path) {
  if (++count_ > policy_.max_images) {
    bad_request(path, "{}: more than {} images in one request (the server's limit)", path,
                policy_.max_images);
  }
}

std::string ImageGate::checked_bytes(const std::string& declared_mime, const std::string& bytes,
                                     const std::string& path) {
  if (bytes.size() > policy_.max_bytes) {
    bad_request(path, "{}: the image is {} bytes, over the server's limit of {} bytes", path,
                bytes.size(), policy_.max_bytes);
  }
  const std::span<const uint8_t> view(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  vision::ImageLimits limits;
  limits.max_bytes = policy_.max_bytes;
  std::string actual;
  try {
    const vision::ImageFormat format = vision::sniff_format(view, path);
    actual = image_mime_of(format);
    if (!declared_mime.empty() && declared_mime != actual) {
      bad_request(path, "{}: declared as {} but the bytes are a {} image ({})", path, declared_mime,
                  vision::format_name(format), actual);
    }
    vision::probe_image(view, path, limits);  // headers only: size, mode, every limit
  } catch (const InvalidArgument& e) {
    bad_request(path, "{}", e.what());
  }
  if (policy_.text_only) {
    bad_request(path,
                "{}: this model is text only (its checkpoint has no vision tower), so it cannot "
                "take images; send the request without image parts or serve a model with a vision "
                "tower",
                path);
  }
  return actual;
}

std::string ImageGate::from_base64(const std::string& mime, const std::string& data,
                                   const std::string& path, const std::string& mime_path) {
  count_one(path);
  const std::string declared = mime.empty() ? std::string() : accepted_mime(mime, mime_path);
  if (data.empty()) bad_request(path, "{}: the image data is empty", path);
  if (data.size() > base64_chars_for(policy_.max_bytes)) {
    bad_request(path,
                "{}: {} base64 characters, over the server's limit of {} bytes per image (about "
                "{} characters)",
                path, data.size(), policy_.max_bytes, base64_chars_for(policy_.max_bytes));
  }
  std::optional<std::string> bytes = base64::decode(data);
  if (!bytes) {
    bad_request(path,
                "{}: the image data is not well-formed base64 (the standard alphabet A-Z a-z 0-9 "
                "+ /, = padding, a multiple of 4 characters, no spaces or line breaks)",
                path);
  }
  const std::string actual = checked_bytes(declared, *bytes, path);
  return fmt::format("data:{};base64,{}", actual, data);
}

std::string ImageGate::from_url(const std::string& url, const std::string& path) {
  if (has_prefix_nocase(url, "http://") || has_prefix_nocase(url, "https://")) {
    if (!policy_.allow_urls) {
      bad_request(path,
                  "{}: remote image URLs are not fetched by this server (it fetches nothing a "
                  "client names unless started with `serve --allow-image-urls`); send the image "
                  "inline as a data URL (data:image/png;base64,...)",
                  path);
    }
    count_one(path);
    std::string bytes;
    try {
      bytes = fetch_image_url(url, path, policy_.max_bytes, policy_.fetch_seconds);
    } catch (const InvalidArgument& e) {
      bad_request(path, "{}", e.what());
    }
    const std::string actual = checked_bytes("", bytes, path);
    return fmt::format("data:{};base64,{}", actual, base64::encode(bytes));
  }
  if (!has_prefix_nocase(url, "data:")) {
    const size_t colon = url.find(':');
    const std::string scheme =
        colon == std::string::npos || colon > 32 ? std::string() : url.substr(0, colon);
    bad_request(
        path, "{}: expected a data URL (data:image/png;base64,...){}, got {}", path,
        policy_.allow_urls ? " or an http(s) URL" : "",
        scheme.empty() ? std::string("no URL scheme") : fmt::format("the scheme \"{}:\"", scheme));
  }
  const size_t comma = url.find(',');
  if (comma == std::string::npos) {
    bad_request(path, "{}: a data URL needs a comma before its data (data:image/png;base64,...)",
                path);
  }
  // data:<mime>[;param=value]*;base64,<data>
  const std::string header = url.substr(5, comma - 5);
  const size_t semi = header.rfind(';');
  if (semi == std::string::npos || lower_ascii(header.substr(semi + 1)) != "base64") {
    bad_request(path,
                "{}: only base64 data URLs are accepted (data:<mime>;base64,<data>); this one has "
                "no ;base64 marker",
                path);
  }
  const std::string mime = accepted_mime(header.substr(0, header.find(';')), path);
  return from_base64(mime, url.substr(comma + 1), path, path);
}

json ImageGate::part(const std::string& data_url, const std::string& path) {
  return {{"type", "image_url"}, {"image_url", {{"url", data_url}}}, {kPartPathKey, path}};
}

void name_images_by_client_path(const json& body, std::vector<ChatMessage>& messages) {
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array()) return;
  std::map<std::string, std::string> paths;  // the internal part's path -> the client's
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    if (!m.is_object()) continue;
    auto c = m.find("content");
    if (c == m.end() || !c->is_array()) continue;
    for (size_t k = 0; k < c->size(); ++k) {
      const json& p = (*c)[k];
      if (!p.is_object()) continue;
      auto cp = p.find(kPartPathKey);
      if (cp != p.end() && cp->is_string())
        paths[fmt::format("messages[{}].content[{}]", i, k)] = cp->get<std::string>();
    }
  }
  for (ChatMessage& m : messages) {
    for (ChatImage& img : m.images) {
      if (auto it = paths.find(img.name); it != paths.end()) img.name = it->second;
    }
  }
}

void check_chat_images(json& body, const ImagePolicy& policy) {
  if (policy.checked) return;
  json* messages = nullptr;
  if (auto it = body.find("messages"); it != body.end() && it->is_array()) messages = &*it;
  if (messages == nullptr) return;  // parse_chat_request says what is wrong with it
  ImageGate gate(policy);
  for (size_t i = 0; i < messages->size(); ++i) {
    json& m = (*messages)[i];
    if (!m.is_object()) continue;
    auto c = m.find("content");
    if (c == m.end() || !c->is_array()) continue;
    for (size_t k = 0; k < c->size(); ++k) {
      json& p = (*c)[k];
      if (!p.is_object()) continue;
      auto t = p.find("type");
      // The renderer also reads {"type": "image"} parts (with image_url or url): they pass the
      // same gate, so no image reaches it unchecked.
      if (t == p.end() || (*t != "image_url" && *t != "image")) continue;
      const bool image_type = *t == "image";
      const std::string path = fmt::format("messages[{}].content[{}]", i, k);
      for (const auto& item : p.items()) {
        if (item.key() != "type" && item.key() != "image_url" &&
            !(image_type && item.key() == "url")) {
          bad_request(path + "." + item.key(), "{}.{} is not supported in an {} part (type, {})",
                      path, item.key(), image_type ? "image" : "image_url",
                      image_type ? "image_url or url" : "image_url");
        }
      }
      auto iu = p.find("image_url");
      if (image_type && (iu == p.end() || iu->is_null())) {
        const std::string upath = path + ".url";
        auto u = p.find("url");
        if (u == p.end() || !u->is_string())
          bad_request(upath, "{}: expected a string (a data URL) in url or image_url", upath);
        p = ImageGate::part(gate.from_url(u->get<std::string>(), upath), upath);
        continue;
      }
      const std::string ipath = path + ".image_url";
      if (iu == p.end() || iu->is_null()) bad_request(ipath, "{}: missing (required)", ipath);
      std::string url;
      if (iu->is_string()) {
        url = iu->get<std::string>();
      } else if (iu->is_object()) {
        for (const auto& item : iu->items()) {
          if (item.key() != "url" && item.key() != "detail") {
            bad_request(ipath + "." + item.key(),
                        "{}.{} is not supported (url, and detail, which is accepted and ignored: "
                        "K3 sees every image at the resolution its processor chooses)",
                        ipath, item.key());
          }
        }
        if (auto d = iu->find("detail"); d != iu->end() && !d->is_null()) {
          if (!d->is_string() || (*d != "auto" && *d != "low" && *d != "high")) {
            bad_request(ipath + ".detail", "{}.detail: expected \"auto\", \"low\" or \"high\"",
                        ipath);
          }
        }
        auto u = iu->find("url");
        if (u == iu->end() || !u->is_string()) {
          bad_request(ipath + ".url", "{}.url: expected a string (a data URL)", ipath);
        }
        url = u->get<std::string>();
      } else {
        bad_request(ipath, "{}: expected an object {{\"url\": ...}}", ipath);
      }
      p = ImageGate::part(gate.from_url(url, ipath), ipath);
    }
  }
}

}  // namespace deltafin::server
