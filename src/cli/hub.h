// The Hugging Face hub's HTTP protocol as `deltafin pull` uses it (libcurl underneath):
//  * GET {endpoint}/api/models/{repo}/revision/{rev} pins a branch or tag to its commit ("sha");
//  * GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true lists the files, page by page
//    (the next page's URL in a `Link: <...>; rel="next"` header), each with its size, its git
//    blob id ("oid") and, for LFS files, "lfs": {"oid": SHA-256, "size"};
//  * GET {endpoint}/{repo}/resolve/{commit}/{path} serves a file, usually by a redirect to a CDN
//    that answers HTTP ranges.
// HF_ENDPOINT replaces the endpoint (mirrors); HF_TOKEN (else the token file huggingface_hub
// writes, $HF_HOME/token) is sent as a bearer token only to the endpoint's own origin (scheme,
// host and port): never to a host a redirect or a listing page's Link leads to. The answers are
// checked by hub_listing.* before anything uses them. The listing (revision, every page) must
// finish within a deadline and every JSON answer within a size, so an endless or dripping body
// stops the run with a message instead of hanging it. The same code runs against the real hub
// and against the tests' mock (tests/pull/).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/hub_listing.h"

namespace deltafin::cli {

// One HTTP exchange's outcome. `status` 0 means no response (connection refused, dropped,
// timed out: `error` says which).
struct HttpResult {
  long status = 0;
  std::string error;
  std::string body;       // for JSON and error responses (not for file bodies)
  std::string link_next;  // the Link header's rel="next" URL, if any
  std::string content_range;
  std::string retry_after;
  bool too_large = false;  // the body passed get()'s max_body: the transfer was stopped
  bool timed_out = false;  // the deadline passed: the transfer was stopped
};

using Deadline = std::chrono::steady_clock::time_point;

// A reusable connection (one per worker thread: keep-alive to the hub and the CDN). The token
// goes only with requests to `token_origin` (an endpoint URL; its scheme, host and port count).
class HttpClient {
 public:
  HttpClient(std::string token, const std::string& token_origin);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET `url` into result.body. A body over `max_body` bytes stops the transfer (too_large); so
  // does `deadline` passing (timed_out).
  HttpResult get(const std::string& url, size_t max_body, Deadline deadline);
  // GET bytes [begin, end) of `url`; 200/206 bodies go to `sink(data, n)`, which returns false to
  // abort (a write error); other statuses' bodies go to result.body. `stop` is polled during the
  // transfer; returning true aborts it.
  HttpResult get_range(const std::string& url, uint64_t begin, uint64_t end,
                       const std::function<bool(const char*, size_t)>& sink,
                       const std::function<bool()>& stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct HubRepo {
  std::string endpoint, repo, revision, commit;
  std::vector<HubFile> files;
};

// The token pull sends: $HF_TOKEN, else the file $HF_HOME/token (HF_HOME defaults to
// ~/.cache/huggingface), else "".
std::string hub_token();
// $HF_ENDPOINT (without a trailing '/'), else https://huggingface.co.
std::string hub_endpoint();
// "scheme://host:port" of a URL (lowercase, the scheme's default port filled in); "" when it is
// not an http(s) URL libcurl can parse.
std::string url_origin(const std::string& url);

// The most a JSON answer of the hub may hold (a listing page, the revision, the shard index).
inline constexpr size_t kMaxHubJsonBytes = size_t{64} << 20;
// How long the listing (the revision and every page) may take, and so does the shard index of
// --include: $DELTAFIN_PULL_LISTING_TIMEOUT seconds, else 600. Throws Error on a value that is
// not a whole number of seconds from 1 to 86400.
std::chrono::seconds listing_timeout();

// Pins `revision` to a commit and lists every file (checked by HubListing). Throws Error with one
// line for what the hub refused (a 401 names HF_TOKEN; a 404 names the repository or revision),
// for a listing that is not as expected, and for one that does not end by listing_timeout().
HubRepo list_repo(HttpClient& http, const std::string& endpoint, const std::string& repo,
                  const std::string& revision, bool have_token);
// The URL that serves one file at the pinned commit.
std::string resolve_url(const HubRepo& r, const std::string& path);
// Throws Error unless `repo` looks like ORG/NAME (letters, digits, '.', '_', '-').
void check_repo_name(const std::string& repo);
// GETs a JSON answer of the hub: transient failures (no response, 429, 5xx) are retried up to
// five times until `deadline`; anything but a 200 with a body within kMaxHubJsonBytes throws
// Error (`what` names the request).
std::string get_hub_json(HttpClient& http, const std::string& url, const std::string& what,
                         Deadline deadline, bool have_token);
// One line for a refused request ("401 Unauthorized: ..."), naming what to do.
std::string http_failure(const HttpResult& r, const std::string& what, bool have_token);

}  // namespace deltafin::cli
