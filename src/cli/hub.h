// The Hugging Face hub's HTTP protocol as `deltafin pull` uses it (libcurl underneath):
//  * GET {endpoint}/api/models/{repo}/revision/{rev} pins a branch or tag to its commit ("sha");
//  * GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true lists the files, page by page
//    (the next page's URL in a `Link: <...>; rel="next"` header), each with its size, its git
//    blob id ("oid") and, for LFS files, "lfs": {"oid": SHA-256, "size"};
//  * GET {endpoint}/{repo}/resolve/{commit}/{path} serves a file, usually by a redirect to a CDN
//    that answers HTTP ranges.
// HF_ENDPOINT replaces the endpoint (mirrors); HF_TOKEN (else the token file huggingface_hub
// writes, $HF_HOME/token) is sent as a bearer token to the hub and never to a host it redirects
// to. The same code runs against the real hub and against the tests' mock (tests/pull/).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
};

// A reusable connection (one per worker thread: keep-alive to the hub and the CDN).
class HttpClient {
 public:
  explicit HttpClient(std::string token);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET `url` into result.body (at most `max_body` bytes kept).
  HttpResult get(const std::string& url, size_t max_body = 64ull << 20);
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

struct HubFile {
  std::string path;  // in the repository, '/'-separated
  uint64_t size = 0;
  std::string oid;     // git blob SHA-1 (of the bytes, or of the LFS pointer)
  std::string sha256;  // LFS files: SHA-256 of the bytes; "" otherwise
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

// Pins `revision` to a commit and lists every file. Throws Error with one line for what the
// hub refused (a 401 names HF_TOKEN; a 404 names the repository or revision).
HubRepo list_repo(HttpClient& http, const std::string& endpoint, const std::string& repo,
                  const std::string& revision, bool have_token);
// The URL that serves one file at the pinned commit.
std::string resolve_url(const HubRepo& r, const std::string& path);
// Throws Error unless `repo` looks like ORG/NAME (letters, digits, '.', '_', '-').
void check_repo_name(const std::string& repo);
// Throws Error unless a listed path is safe to create under the target folder: relative, no
// "." or ".." component, no backslash or NUL.
void check_repo_path(const std::string& path);
// One line for a refused request ("401 Unauthorized: ..."), naming what to do.
std::string http_failure(const HttpResult& r, const std::string& what, bool have_token);

}  // namespace deltafin::cli
