// libcurl under the limits of image_fetch.h.
#include "server/image_fetch.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>

#include "core/error.h"

namespace deltafin::server {

namespace {

struct ImageFetchSink {
  std::string body;
  uint64_t max_bytes = 0;
  bool over = false;
};

size_t image_fetch_write(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<ImageFetchSink*>(user);
  const size_t len = size * n;
  if (sink->body.size() + len > sink->max_bytes) {
    sink->over = true;
    return 0;  // libcurl stops with CURLE_WRITE_ERROR
  }
  sink->body.append(data, len);
  return len;
}

struct CurlHandle {
  CURL* h = curl_easy_init();
  ~CurlHandle() {
    if (h != nullptr) curl_easy_cleanup(h);
  }
};

bool is_http_url(const std::string& url) {
  auto lower_prefix = [&](const char* p) {
    const std::string s(p);
    if (url.size() < s.size()) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(url[i])) != s[i]) return false;
    }
    return true;
  };
  return lower_prefix("http://") || lower_prefix("https://");
}

}  // namespace

std::string fetch_image_url(const std::string& url, const std::string& name, uint64_t max_bytes,
                            double seconds) {
  if (!is_http_url(url)) fail_arg("{}: only http and https image URLs are fetched", name);
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CurlHandle c;
  if (c.h == nullptr) fail_arg("{}: cannot start a fetch (libcurl)", name);
  ImageFetchSink sink;
  sink.max_bytes = max_bytes;
  const long total_ms = std::lround(std::max(0.001, seconds) * 1000);
  char err[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c.h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c.h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c.h, CURLOPT_MAXREDIRS, 3L);
  curl_easy_setopt(c.h, CURLOPT_TIMEOUT_MS, total_ms);
  curl_easy_setopt(c.h, CURLOPT_CONNECTTIMEOUT_MS, std::min(total_ms, 5000L));
  curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c.h, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(max_bytes));
  curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, image_fetch_write);
  curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c.h, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c.h, CURLOPT_USERAGENT, "deltafin/" DELTAFIN_VERSION);
  curl_easy_setopt(c.h, CURLOPT_ACCEPT_ENCODING, "identity");
  const CURLcode rc = curl_easy_perform(c.h);
  if (sink.over || rc == CURLE_FILESIZE_EXCEEDED) {
    fail_arg("{}: the image at the URL is over the server's limit of {} bytes", name, max_bytes);
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    fail_arg("{}: fetching the image URL took longer than {} s", name, seconds);
  }
  if (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_TOO_MANY_REDIRECTS) {
    fail_arg("{}: the image URL redirects too often or to a scheme other than http(s) ({})", name,
             err[0] != 0 ? err : curl_easy_strerror(rc));
  }
  if (rc != CURLE_OK) {
    fail_arg("{}: the image URL could not be fetched: {}", name,
             err[0] != 0 ? err : curl_easy_strerror(rc));
  }
  long status = 0;
  curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    fail_arg("{}: fetching the image URL answered HTTP {} (expected 200)", name, status);
  }
  return std::move(sink.body);
}

}  // namespace deltafin::server
