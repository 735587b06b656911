// The hub client (hub.h). One libcurl easy handle per HttpClient, reused for keep-alive; the
// bearer token is set or cleared before each request by comparing the request's origin with
// the endpoint's, so neither a redirect (libcurl drops it for another host) nor a listing page's
// Link header (our code follows those) can carry it to another host.
#include "cli/hub.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/json_parse.h"

namespace deltafin::cli {

namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t b = 0;
  while (b < s.size() && s[b] == ' ') ++b;
  return s.substr(b);
}

// `<URL>; rel="next"` out of a Link header (several links may be comma-separated).
std::string next_link(const std::string& header) {
  size_t pos = 0;
  while (pos < header.size()) {
    const size_t lt = header.find('<', pos), gt = header.find('>', lt);
    if (lt == std::string::npos || gt == std::string::npos) break;
    const size_t end = header.find(',', gt);
    const std::string params =
        header.substr(gt + 1, end == std::string::npos ? std::string::npos : end - gt - 1);
    if (params.find("rel=\"next\"") != std::string::npos ||
        params.find("rel=next") != std::string::npos)
      return header.substr(lt + 1, gt - lt - 1);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

std::string url_escape_path(const std::string& path) {
  std::string out;
  for (unsigned char ch : path) {
    if (std::isalnum(ch) || ch == '/' || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += fmt::format("%{:02X}", ch);
    }
  }
  return out;
}

}  // namespace

struct HttpClient::Impl {
  CURL* curl = nullptr;
  std::string token, token_origin;
  HttpResult* result = nullptr;
  const std::function<bool(const char*, size_t)>* sink = nullptr;
  const std::function<bool()>* stop = nullptr;
  size_t max_body = 0;
  bool sink_failed = false, too_large = false;

  static size_t on_header(char* data, size_t size, size_t n, void* self) {
    auto* me = static_cast<Impl*>(self);
    const std::string line(data, size * n);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string key = line.substr(0, colon);
      for (auto& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const std::string value = trim(line.substr(colon + 1));
      if (key == "link") me->result->link_next = next_link(value);
      if (key == "content-range") me->result->content_range = value;
      if (key == "retry-after") me->result->retry_after = value;
    } else if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect): reset
      me->result->link_next.clear();
      me->result->content_range.clear();
    }
    return size * n;
  }

  static size_t on_body(char* data, size_t size, size_t n, void* self) {
    auto* me = static_cast<Impl*>(self);
    long status = 0;
    curl_easy_getinfo(me->curl, CURLINFO_RESPONSE_CODE, &status);
    if (me->sink != nullptr && (status == 200 || status == 206)) {
      if (!(*me->sink)(data, size * n)) {
        me->sink_failed = true;
        return 0;
      }
      return size * n;
    }
    std::string& body = me->result->body;
    if (size * n > me->max_body - std::min(me->max_body, body.size())) {
      me->too_large = true;  // an answer larger than any we expect: stop reading it
      return 0;
    }
    body.append(data, size * n);
    return size * n;
  }

  static int on_progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto* me = static_cast<Impl*>(self);
    return me->stop != nullptr && *me->stop && (*me->stop)() ? 1 : 0;
  }

  // `timeout_ms` 0: no deadline.
  HttpResult perform(const std::string& url, const std::string& range, long timeout_ms) {
    HttpResult r;
    result = &r;
    sink_failed = too_large = false;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_RANGE, range.empty() ? nullptr : range.c_str());
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    // Bearer authentication goes to the endpoint's origin only. libcurl itself never sends it to
    // a host a redirect leads to (the CDN's URLs are signed); a URL we were handed (a listing
    // page's Link) is checked here.
    const bool send_token = !token.empty() && url_origin(url) == token_origin;
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, send_token ? CURLAUTH_BEARER : CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_XOAUTH2_BEARER, send_token ? token.c_str() : nullptr);
    const CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
    r.too_large = too_large;
    r.timed_out = code == CURLE_OPERATION_TIMEDOUT && timeout_ms > 0;
    if (code != CURLE_OK) {
      r.error = sink_failed ? "write failed" : curl_easy_strerror(code);
      if (code == CURLE_ABORTED_BY_CALLBACK) r.error = "stopped";
      if (!sink_failed && code != CURLE_HTTP_RETURNED_ERROR) r.status = 0;
    }
    result = nullptr;
    return r;
  }
};

HttpClient::HttpClient(std::string token, const std::string& token_origin)
    : impl_(std::make_unique<Impl>()) {
  global_init();
  impl_->token = std::move(token);
  impl_->token_origin = url_origin(token_origin);
  CURL* c = impl_->curl = curl_easy_init();
  if (c == nullptr) fail("cannot initialise libcurl");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 8L);
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "deltafin/" DELTAFIN_VERSION);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  // A transfer slower than 1 KB/s for 60 s is dropped and retried.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Impl::on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, impl_.get());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Impl::on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, impl_.get());
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &Impl::on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, impl_.get());
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
}

HttpClient::~HttpClient() {
  if (impl_->curl != nullptr) curl_easy_cleanup(impl_->curl);
}

HttpResult HttpClient::get(const std::string& url, size_t max_body, Deadline deadline) {
  impl_->sink = nullptr;
  impl_->stop = nullptr;
  impl_->max_body = max_body;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    HttpResult r;
    r.timed_out = true;
    r.error = "the deadline passed";
    return r;
  }
  return impl_->perform(url, "", static_cast<long>(left.count()));
}

HttpResult HttpClient::get_range(const std::string& url, uint64_t begin, uint64_t end,
                                 const std::function<bool(const char*, size_t)>& sink,
                                 const std::function<bool()>& stop) {
  impl_->sink = &sink;
  impl_->stop = &stop;
  impl_->max_body = 64 << 10;
  HttpResult r = impl_->perform(url, fmt::format("{}-{}", begin, end - 1), 0);
  impl_->sink = nullptr;
  impl_->stop = nullptr;
  return r;
}

std::string hub_token() {
  if (const char* t = std::getenv("HF_TOKEN"); t != nullptr && *t) return t;
  std::string home;
  if (const char* h = std::getenv("HF_HOME"); h != nullptr && *h) {
    home = h;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    home = std::string(x) + "/huggingface";
  } else if (const char* u = std::getenv("HOME"); u != nullptr && *u) {
    home = std::string(u) + "/.cache/huggingface";
  }
  if (home.empty()) return "";
  std::ifstream in(home + "/token");
  std::string token;
  std::getline(in, token);
  return trim(token);
}

std::string url_origin(const std::string& url) {
  CURLU* u = curl_url();
  if (u == nullptr) return "";
  std::string out;
  char *scheme = nullptr, *host = nullptr, *port = nullptr;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
    out = fmt::format("{}://{}:{}", scheme, host, port);
    for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (!out.starts_with("http://") && !out.starts_with("https://")) out.clear();
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return out;
}

std::chrono::seconds listing_timeout() {
  const char* v = std::getenv("DELTAFIN_PULL_LISTING_TIMEOUT");
  if (v == nullptr || *v == 0) return std::chrono::seconds(600);
  const std::string s = v;
  long n = 0;
  bool ok = s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char ch) {
              return std::isdigit(static_cast<unsigned char>(ch));
            });
  if (ok) n = std::stol(s);
  if (!ok || n < 1 || n > 86400)
    fail_arg("DELTAFIN_PULL_LISTING_TIMEOUT={}: expected a whole number of seconds from 1 to 86400",
             hub_quote(s));
  return std::chrono::seconds(n);
}

std::string hub_endpoint() {
  std::string e = "https://huggingface.co";
  if (const char* v = std::getenv("HF_ENDPOINT"); v != nullptr && *v) e = v;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

void check_repo_name(const std::string& repo) {
  const size_t slash = repo.find('/');
  auto ok_part = [](const std::string& p) {
    if (p.empty() || p.size() > 96 || p == "." || p == ".." || p.front() == '-') return false;
    for (unsigned char ch : p)
      if (!std::isalnum(ch) && ch != '.' && ch != '_' && ch != '-') return false;
    return true;
  };
  if (slash == std::string::npos || !ok_part(repo.substr(0, slash)) ||
      !ok_part(repo.substr(slash + 1))) {
    fail_arg("repository \"{}\": expected ORG/NAME, as on huggingface.co (e.g. moonshotai/Kimi-K3)",
             repo);
  }
}

std::string http_failure(const HttpResult& r, const std::string& what, bool have_token) {
  std::string detail;
  try {
    const auto j = nlohmann::json::parse(r.body);
    if (j.is_object() && j.contains("error") && j["error"].is_string())
      detail = j["error"].get<std::string>();
  } catch (...) {
  }
  if (r.status == 0) return fmt::format("{}: {}", what, r.error.empty() ? "no response" : r.error);
  if (r.status == 401 || r.status == 403) {
    return fmt::format(
        "{}: the hub answered {}{}: {}", what, r.status, detail.empty() ? "" : " (" + detail + ")",
        have_token
            ? "the token (HF_TOKEN) was refused: check it, and accept the model's license on "
              "its page"
            : "this repository needs a token: set HF_TOKEN to a token from "
              "huggingface.co/settings/tokens (and accept the model's license on its page)");
  }
  if (r.status == 404)
    return fmt::format("{}: not found (404{}): check the repository name and --revision", what,
                       detail.empty() ? "" : ": " + detail);
  return fmt::format("{}: HTTP {}{}", what, r.status, detail.empty() ? "" : " (" + detail + ")");
}

namespace {

// A JSON GET with get_hub_json's retries and checks; the result keeps the answer's headers.
HttpResult get_hub_answer(HttpClient& http, const std::string& url, const std::string& what,
                          Deadline deadline, bool have_token) {
  HttpResult res;
  for (int attempt = 0;; ++attempt) {
    res = http.get(url, kMaxHubJsonBytes, deadline);
    const bool transient = res.status == 0 || res.status == 429 || res.status >= 500;
    if (res.status == 200 || res.too_large || res.timed_out || !transient || attempt >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250 << attempt));
  }
  if (res.too_large)
    fail(
        "{}: the hub's answer is larger than {} MiB, far more than such an answer holds: "
        "refusing to read on",
        what, kMaxHubJsonBytes >> 20);
  if (res.timed_out)
    fail(
        "{}: no complete answer within the listing's deadline of {} s (a body that does not "
        "end, or a very slow link: DELTAFIN_PULL_LISTING_TIMEOUT sets the deadline)",
        what, listing_timeout().count());
  if (res.status != 200) fail("{}", http_failure(res, what, have_token));
  return res;
}

}  // namespace

std::string get_hub_json(HttpClient& http, const std::string& url, const std::string& what,
                         Deadline deadline, bool have_token) {
  return get_hub_answer(http, url, what, deadline, have_token).body;
}

HubRepo list_repo(HttpClient& http, const std::string& endpoint, const std::string& repo,
                  const std::string& revision, bool have_token) {
  check_repo_name(repo);
  const Deadline deadline = std::chrono::steady_clock::now() + listing_timeout();
  HubRepo out;
  out.endpoint = endpoint;
  out.repo = repo;
  out.revision = revision;
  const std::string rev_what = fmt::format("{} at revision {}", repo, revision);
  const std::string rev_url =
      fmt::format("{}/api/models/{}/revision/{}", endpoint, repo, url_escape_path(revision));
  out.commit =
      parse_revision_commit(get_hub_json(http, rev_url, rev_what, deadline, have_token), rev_what);
  HubListing listing(repo);
  const std::string what = fmt::format("listing the files of {}", repo);
  std::string url = fmt::format("{}/api/models/{}/tree/{}?recursive=true", endpoint, repo,
                                url_escape_path(out.commit));
  for (int page = 0; !url.empty(); ++page) {
    if (page >= 100000) fail("{}: the listing does not end (over 100000 pages)", what);
    const HttpResult res = get_hub_answer(http, url, what, deadline, have_token);
    listing.add_page(res.body);
    url = res.link_next;
    if (!url.empty() && url.front() == '/') url = endpoint + url;
  }
  out.files = listing.take();
  return out;
}

std::string resolve_url(const HubRepo& r, const std::string& path) {
  return fmt::format("{}/{}/resolve/{}/{}", r.endpoint, r.repo, url_escape_path(r.commit),
                     url_escape_path(path));
}

}  // namespace deltafin::cli
