// The OpenAI-compatible HTTP front end over cpp-httplib.
//
// Every route goes through one dispatch function, so that authentication, the 404/405 rules,
// error shapes and the request counters are applied in one place. The server listens while the
// model loads (`/health` says "loading", generation endpoints answer 503 with Retry-After) and
// becomes ready when set_ready() hands it the Scheduler.
//
// Threads: each connection has its own thread (http_connections.h: read deadlines, keep-alive,
// pipelining, a cap on open connections), so a slow client never delays another and /health
// always answers. A generation request is validated on that thread, submitted, and then the
// thread waits on its Job: a non-streamed request until the job is done, a streamed one writes
// SSE chunks as updates arrive. While waiting it probes its connection every 50 ms, so a client
// that goes away (queued, mid-prefill or mid-stream) has its job cancelled and its slot freed at
// the next engine step. A full queue is answered with a 429. An HTTP/1.0 client gets its stream
// as a body that ends when the connection closes (it cannot read chunked encoding).
//
// The browser page (web/, embedded at build time) is served at / without authentication — it
// holds no data; the page asks for the API key and sends it on every API call. Its responses
// carry a strict Content-Security-Policy (scripts and styles from this origin only, no inline
// code), so model output can never run as code even if a renderer bug let markup through. The
// engine view's event stream reads only the Metrics copies, never the engine, and does not take
// a scheduler slot; a few such streams may be open at once (beyond: 429).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/metrics.h"
#include "server/request.h"
#include "server/wire.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace deltafin::server {

class Scheduler;
class ApiError;
class ExposedServer;
class ConnectionLoop;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // empty: no authentication
  size_t max_request_bytes = 16u << 20;
  double timeout_s = 600;     // per request, from arrival to the last token
  int max_connections = 512;  // open at once, each on its own thread (beyond: 503)
  std::vector<std::string> aliases;
  std::string model_id = "kimi-k3";
  bool webui = true;  // serve the browser page (web/) at /
};

class HttpServer {
 public:
  HttpServer(const HttpOptions& options, const Tokenizer& tok, Metrics& metrics);
  ~HttpServer();

  // Binds the listening socket (port 0: any free port); returns the port. Throws Error.
  int bind();
  // Serves on a background thread.
  void start();
  // The model is loaded: generation endpoints go live with these limits.
  void set_ready(Scheduler* scheduler, const ServeLimits& limits);
  // Generation endpoints refuse new work (503) from now on; /health says so.
  void set_stopping();
  // Stops listening and waits for the connection threads.
  void stop();

 private:
  // After the headers, before the body: size and framing rules; true when it answered.
  bool before_body(const httplib::Request& req, httplib::Response& res);
  void dispatch(const httplib::Request& req, httplib::Response& res);
  void route(const httplib::Request& req, httplib::Response& res, std::string& label);
  // The scheduler once generation may start; throws 503 while loading or stopping.
  Scheduler* ready() const;
  // Runs a translated request and answers it in its API's shapes (wire.h).
  void generate(const httplib::Request& req, httplib::Response& res, Translation t);
  // The served names and limits (the context is 0 while the model loads).
  ServeLimits served() const;
  // GET /v1/engine/events: an SSE stream of Metrics::engine_snapshot() every 0.5 s.
  void engine_events(const httplib::Request& req, httplib::Response& res);
  // The embedded page; false when `path` is not one of its files (or the page is off).
  bool serve_page(const std::string& path, const httplib::Request& req, httplib::Response& res);
  bool authorized(const httplib::Request& req) const;
  nlohmann::ordered_json model_object(const std::string& id) const;

  HttpOptions opt_;
  const Tokenizer& tok_;
  Metrics& metrics_;
  std::unique_ptr<ExposedServer> svr_;
  std::unique_ptr<ConnectionLoop> loop_;
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<bool> stopping_{false};
  std::atomic<int> engine_streams_{0};
  ServeLimits limits_;  // written once before scheduler_ is published
  int64_t created_ = 0;
  unsigned char key_digest_[32] = {0};
};

// The error style of the API a path belongs to (/v1/messages: Anthropic, /api/: Ollama, else
// OpenAI).
ErrorStyle error_style(const std::string& path);
// Writes an ApiError to a response in `style` (status, JSON body, Retry-After).
void send_error(httplib::Response& res, const ApiError& e, ErrorStyle style);

}  // namespace deltafin::server
