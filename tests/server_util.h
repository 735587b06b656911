// Running the real `deltafin serve` in tests: a synthetic model with a tokenizer (made once per
// test process), the server started on a free loopback port (`--port 0`, the port read from its
// start-up line), stderr collected, and SIGTERM at the end. Plus small HTTP helpers: an httplib
// client, SSE parsing, and a raw socket for clients that vanish mid-request.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "generate/generation.h"
#include "server/request.h"
#include "server/response.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::test {

// The real K3 tokenizer (tests/data/tokenizer), and the limits of a server over it with
// `context` positions and a `max_tokens` ceiling: for the request and response unit tests.
const Tokenizer& k3_tokenizer();
server::ServeLimits k3_limits(int64_t context, int64_t max_tokens);
// Drives `g` to its end as the engine would, with logits that force the ids of `output` (K3
// markers allowed) one by one; each step's events and new tokens go to `step`.
void force_output(Generation& g, const std::string& output,
                  const std::function<void(const server::StepUpdate&)>& step);

// The tiny synthetic model with its byte-level tokenizer (made on first use).
const std::string& server_model_dir();

class ServerProcess {
 public:
  // Starts `deltafin serve --model DIR --port 0 ARGS...` and waits until it is ready (or exits).
  // `model` empty: the tiny synthetic model; kNoModel: no --model at all (the built-in demo, or
  // $DELTAFIN_MODEL, as the user's `deltafin serve` would).
  static constexpr const char* kNoModel = "-";
  explicit ServerProcess(std::vector<std::string> args, const std::string& model = "");
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ready() const { return port_ > 0; }
  int port() const { return port_; }
  int pid() const { return pid_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<httplib::Client> client(int read_timeout_s = 120) const;
  std::string err() const;  // stderr so far
  // SIGTERM, then wait (SIGKILL after `grace_s`); returns the exit code.
  int stop(double grace_s = 20);
  bool running() const;

 private:
  int pid_ = -1;
  int port_ = -1;
  int err_fd_ = -1;
  int exit_code_ = -1;
  mutable std::mutex m_;
  std::string err_;
  std::thread reader_;
};

using json = nlohmann::ordered_json;

// POST a JSON body; returns status and parsed body (null when not JSON).
struct HttpResult {
  int status = -1;
  std::string body;
  json j;
  httplib::Headers headers;
};
HttpResult post_json(httplib::Client& c, const std::string& path, const json& body,
                     const httplib::Headers& headers = {});
HttpResult get(httplib::Client& c, const std::string& path, const httplib::Headers& headers = {});
// Greedy /v1/completions of `prompts` (comma-separated token ids), `max_tokens` each, sent at once
// from one client thread per prompt: the replies, in prompt order.
// One answered request from this thread. httplib, a compiled Debian library that ThreadSanitizer
// does not instrument, builds the regex it reads status lines with on a client's first response
// (a function-local static): TSan cannot see the static's guard, so client threads that each make
// the first response race on it in its eyes. Tests that start client threads call this first, so
// the regex is built before the threads exist.
void prime_client(const ServerProcess& srv);

std::vector<nlohmann::json> concurrent_completions(ServerProcess& srv,
                                                   const std::vector<std::string>& prompts,
                                                   int max_tokens);

// Splits an SSE body into its `data:` payloads; fails the test on a frame that is not
// "data: ...\n\n" (comments starting with ':' are skipped). The last must be "[DONE]".
std::vector<std::string> sse_events(const std::string& body);

// True when `j` is an OpenAI error object: {"error": {"message", "type", "param", "code"}}.
bool is_error_shape(const json& j);

// Runs `node SCRIPT` in tests/DIR (a package pinned by its lockfile) with `env` ("A=1 B=2"),
// installing the packages first when node_modules lacks `package` (`make test` installs them
// beforehand). Returns false (and says why in `out`) when npm ci fails; `exit_code` is node's.
bool run_node_test(const std::string& dir, const std::string& package, const std::string& env,
                   const std::string& script, std::string& out, int& exit_code);

// The four official clients (tests/api_clients/family_test.mjs: OpenAI Chat Completions and
// Responses, Anthropic, Ollama) against `serve` over the make-model in `model_dir`, served as
// `model_id`: a call of a declared tool in each API's shape (the answers scripted by the
// DELTAFIN_DEBUG_SCRIPT hook), then conversations holding tool calls whose second turns prefill
// only what the client added, and the same against a server with --state-cache none, whose
// answers must be the same. For the K2 family and Kimi-Linear (both speak K2's chat markers).
void expect_family_clients_reuse_state(const std::string& model_dir, const std::string& model_id);

// A raw TCP connection to the server (for a client that disappears).
class RawClient {
 public:
  explicit RawClient(int port);
  ~RawClient();
  bool send_request(const std::string& method, const std::string& path, const std::string& body);
  // Reads until `needle` appears or `timeout_s` passes; returns what was read.
  std::string read_until(const std::string& needle, double timeout_s);
  void close_now();  // RST-free close

 private:
  int fd_ = -1;
  std::string got_;
};

}  // namespace deltafin::test
