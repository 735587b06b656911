#include "cli/hub.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

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
  std::string token;
  HttpResult* result = nullptr;
  const std::function<bool(const char*, size_t)>* sink = nullptr;
  const std::function<bool()>* stop = nullptr;
  size_t max_body = 0;
  bool sink_failed = false;

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
    body.append(data, std::min(size * n, me->max_body - std::min(me->max_body, body.size())));
    return size * n;
  }

  static int on_progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto* me = static_cast<Impl*>(self);
    return me->stop != nullptr && *me->stop && (*me->stop)() ? 1 : 0;
  }

  HttpResult perform(const std::string& url, const std::string& range) {
    HttpResult r;
    result = &r;
    sink_failed = false;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_RANGE, range.empty() ? nullptr : range.c_str());
    const CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
    if (code != CURLE_OK) {
      r.error = sink_failed ? "write failed" : curl_easy_strerror(code);
      if (code == CURLE_ABORTED_BY_CALLBACK) r.error = "stopped";
      if (!sink_failed && code != CURLE_HTTP_RETURNED_ERROR) r.status = 0;
    }
    result = nullptr;
    return r;
  }
};

HttpClient::HttpClient(std::string token) : impl_(std::make_unique<Impl>()) {
  global_init();
  impl_->token = std::move(token);
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
  if (!impl_->token.empty()) {
    // Bearer authentication goes to the host asked, never to a host a redirect leads to (the
    // CDN's URLs are signed).
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, impl_->token.c_str());
  }
}

HttpClient::~HttpClient() {
  if (impl_->curl != nullptr) curl_easy_cleanup(impl_->curl);
}

HttpResult HttpClient::get(const std::string& url, size_t max_body) {
  impl_->sink = nullptr;
  impl_->stop = nullptr;
  impl_->max_body = max_body;
  return impl_->perform(url, "");
}

HttpResult HttpClient::get_range(const std::string& url, uint64_t begin, uint64_t end,
                                 const std::function<bool(const char*, size_t)>& sink,
                                 const std::function<bool()>& stop) {
  impl_->sink = &sink;
  impl_->stop = &stop;
  impl_->max_body = 64 << 10;
  HttpResult r = impl_->perform(url, fmt::format("{}-{}", begin, end - 1));
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

void check_repo_path(const std::string& path) {
  bool ok = !path.empty() && path.front() != '/' && path.find('\\') == std::string::npos &&
            path.find('\0') == std::string::npos && path.size() < 4096;
  size_t b = 0;
  while (ok && b <= path.size()) {
    const size_t e = std::min(path.find('/', b), path.size());
    const std::string part = path.substr(b, e - b);
    ok = !part.empty() && part != "." && part != "..";
    b = e + 1;
  }
  if (!ok)
    fail("the hub listed a file path \"{}\" that is not a plain relative path: refusing it", path);
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

HubRepo list_repo(HttpClient& http, const std::string& endpoint, const std::string& repo,
                  const std::string& revision, bool have_token) {
  check_repo_name(repo);
  HubRepo out;
  out.endpoint = endpoint;
  out.repo = repo;
  out.revision = revision;
  auto get_json = [&](const std::string& url, const std::string& what, HttpResult& res) {
    for (int attempt = 0;; ++attempt) {
      res = http.get(url);
      const bool transient = res.status == 0 || res.status == 429 || res.status >= 500;
      if (res.status == 200 || !transient || attempt >= 4) break;
    }
    if (res.status != 200) fail("{}", http_failure(res, what, have_token));
    return parse_json(res.body, what);
  };
  HttpResult res;
  const std::string rev_url =
      fmt::format("{}/api/models/{}/revision/{}", endpoint, repo, url_escape_path(revision));
  const auto info = get_json(rev_url, fmt::format("{} at revision {}", repo, revision), res);
  out.commit = info.is_object() && info.contains("sha") && info["sha"].is_string()
                   ? info["sha"].get<std::string>()
                   : revision;
  std::string url = fmt::format("{}/api/models/{}/tree/{}?recursive=true", endpoint, repo,
                                url_escape_path(out.commit));
  for (int page = 0; !url.empty(); ++page) {
    if (page > 100000) fail("{}: the file listing does not end (over 100000 pages)", repo);
    const auto items = get_json(url, fmt::format("listing the files of {}", repo), res);
    if (!items.is_array()) fail("listing the files of {}: expected a JSON list", repo);
    for (const auto& e : items) {
      if (!e.is_object() || e.value("type", "") != "file") continue;
      HubFile f;
      f.path = e.value("path", "");
      check_repo_path(f.path);
      if (!e.contains("size") || !e["size"].is_number_unsigned())
        fail("listing the files of {}: {} has no size", repo, f.path);
      f.size = e["size"].get<uint64_t>();
      f.oid = e.value("oid", "");
      if (e.contains("lfs") && e["lfs"].is_object()) {
        f.sha256 = e["lfs"].value("oid", "");
        if (e["lfs"].contains("size") && e["lfs"]["size"].is_number_unsigned())
          f.size = e["lfs"]["size"].get<uint64_t>();
      }
      out.files.push_back(std::move(f));
    }
    url = res.link_next;
    if (!url.empty() && url.front() == '/') url = endpoint + url;
  }
  return out;
}

std::string resolve_url(const HubRepo& r, const std::string& path) {
  return fmt::format("{}/{}/resolve/{}/{}", r.endpoint, r.repo, url_escape_path(r.commit),
                     url_escape_path(path));
}

}  // namespace deltafin::cli
