// HTTP routes, authentication, error shapes and SSE streaming (see http_server.h).
//
// httplib must be compiled with the macros of its pkg-config file (CPPHTTPLIB_OPENSSL_SUPPORT,
// ZLIB, BROTLI), which the build applies to every target that links libdeltafin; in the library
// only this file and http_connections.cpp include it. The request-size rules that must act
// before a body is read (an oversize Content-Length is refused at once, a POST without one has
// an empty body, the body's read deadline) sit in the pre-routing handler, which httplib calls
// after the headers and before the body; so does the answer to what the connection layer refused
// before routing (a body whose framing is in doubt, a Range the server will not serve) and the
// rule of a reserve connection (/health only, http_connections.h).
//
// Range (RFC 9110 §14.2) is honoured for the page's files only, at most kMaxRanges ranges, none
// overlapping another, each starting inside the file (else 416); every other response ignores
// it, as RFC 9110 allows: a JSON answer or error is never worth sending in parts, and a list of
// ranges over it would multiply it. A request's schemas, tools and grammars compile under one
// compile budget (grammar/budget.h) whose cancel check is the request's ConnectionProbe: a
// compile whose client left stops (logged, answered 499 to nobody).
#include "server/http_server.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <chrono>
#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "grammar/budget.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/connection_probe.h"
#include "server/engine_timeline.h"
#include "server/http_connections.h"
#include "server/ollama_api.h"
#include "server/response.h"
#include "server/responses_api.h"
#include "server/scheduler.h"
#include "server/tokens_api.h"
#include "server/web_assets.h"

namespace deltafin::server {

namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

constexpr auto kPoll = 50ms;          // how often a waiting handler probes its client
constexpr double kKeepAliveS = 10.0;  // SSE comment after this long without output
constexpr size_t kMaxPath = 2048;
constexpr auto kEngineEvery = 500ms;  // engine view snapshot period
constexpr int kMaxEngineStreams = 4;  // engine view streams open at once
constexpr size_t kMaxRanges = 8;      // ranges one Range header may ask of a page file
// Only this origin's files; no inline script or style; no framing; fetch() to this origin only.
constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
// The engine ends a request at its deadline at the next step; if a step never ends (a wedged
// read), the handler gives up this long after the deadline so the client still hears back.
constexpr double kHandlerGraceS = 60.0;

// The probe of this request's client: given the socket when the request came through Deltafin's
// connection loop (connection_probe.h says why that matters).
std::unique_ptr<ConnectionProbe> probe_for(const httplib::Request& req) {
  const ConnectionContext* c = current_connection();
  return std::make_unique<ConnectionProbe>(req.remote_addr, req.remote_port, req.local_port,
                                           c != nullptr ? c->fd : -1);
}

ApiError handler_timeout() {
  return ApiError(
      504,
      "the request did not finish within the server's time limit (--timeout); the engine is busy",
      "timeout_error", std::nullopt, "timeout");
}

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}

void digest(const std::string& s, unsigned char out[32]) {
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), out);
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

const char* error_message(int status) {
  switch (status) {
    case 400:
      return "the request could not be read (malformed HTTP)";
    case 404:
      return "unknown path";
    case 408:
      return "the request did not arrive in time";
    case 431:
      return "the request headers are too large";
    case 413:
      return "the request body is larger than the server accepts (--max-request-bytes)";
    case 414:
      return "the request URI is too long";
    case 416:
      return "range not satisfiable";
    default:
      return "request failed";
  }
}

// Streams with chunked transfer encoding, or to an HTTP/1.0 client (which cannot read chunks)
// as a body that ends when the connection closes.
void stream_to(const httplib::Request& req, httplib::Response& res, const char* type,
               httplib::ContentProviderWithoutLength provider,
               httplib::ContentProviderResourceReleaser releaser) {
  if (req.version == "HTTP/1.0") {
    if (ConnectionContext* c = current_connection()) c->close_after = true;
    res.set_content_provider(type, std::move(provider), std::move(releaser));
  } else {
    res.set_chunked_content_provider(type, std::move(provider), std::move(releaser));
  }
}

// The path as routing sees it: trailing slashes dropped, the OpenAI paths under /v1.
std::string normal_path(const std::string& raw) {
  std::string path = raw;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  // The OpenAI paths are also served without the /v1 prefix (some clients drop it).
  if (path == "/models" || starts_with(path, "/models/") || path == "/chat/completions" ||
      path == "/completions" || path == "/responses") {
    path = "/v1" + path;
  }
  if (path == "/v1/health") path = "/health";
  return path;
}

// The embedded page file at `path` (routing's form), or null.
const WebAsset* page_file(const std::string& path) {
  const std::string file = path == "/" ? "/index.html" : path;
  for (const auto& a : web_assets()) {
    if (file == a.path) return &a;
  }
  return nullptr;
}

// Keeps the request's ranges only when they ask for parts of a page file as the file comment
// says, resolved against its size (so httplib's Content-Range headers are right); else refuses
// them (416) or drops them.
void check_ranges(httplib::Request& req, ConnectionContext& ctx, bool webui) {
  if (req.ranges.empty()) return;
  const WebAsset* file = webui && (req.method == "GET" || req.method == "HEAD")
                             ? page_file(normal_path(req.path))
                             : nullptr;
  if (file == nullptr || file->size == 0) {
    req.ranges.clear();
    return;
  }
  const auto size = static_cast<ssize_t>(file->size);
  auto refuse = [&](const std::string& why) {
    ctx.refusal.status = 416;
    ctx.refusal.code = "range_not_satisfiable";
    ctx.refusal.message = fmt::format(
        "Range: {}; {} has {} bytes, and a Range may ask for at most {} parts of it, none "
        "overlapping another, each starting inside it",
        why, file->path, size, kMaxRanges);
    ctx.refusal.content_range = fmt::format("bytes */{}", size);
    req.ranges.clear();
  };
  if (req.ranges.size() > kMaxRanges) return refuse(fmt::format("{} ranges", req.ranges.size()));
  httplib::Ranges resolved;
  for (auto [first, last] : req.ranges) {
    if (first < 0 && last < 0) {  // "-": the whole file
      first = 0;
      last = size - 1;
    } else if (first < 0) {  // "-N": the last N bytes
      if (last == 0) return refuse("a suffix of 0 bytes");
      first = std::max<ssize_t>(0, size - last);
      last = size - 1;
    } else {
      if (first >= size) return refuse(fmt::format("the range {}- starts past the end", first));
      if (last < 0 || last >= size) last = size - 1;
    }
    resolved.emplace_back(first, last);
  }
  httplib::Ranges sorted = resolved;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first <= sorted[i - 1].second)
      return refuse(fmt::format("the ranges {}-{} and {}-{} overlap", sorted[i - 1].first,
                                sorted[i - 1].second, sorted[i].first, sorted[i].second));
  }
  req.ranges = std::move(resolved);
}

}  // namespace

void send_error(httplib::Response& res, const ApiError& e, ErrorStyle style) {
  send_json(res, e.status(), error_json(e, style));
  if (e.retry_after() > 0) res.set_header("Retry-After", std::to_string(e.retry_after()));
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
}

ErrorStyle error_style(const std::string& path) {
  if (starts_with(path, "/v1/messages")) return ErrorStyle::anthropic;
  if (starts_with(path, "/api/")) return ErrorStyle::ollama;
  return ErrorStyle::openai;
}

HttpServer::HttpServer(const HttpOptions& options, const Tokenizer& tok, Metrics& metrics)
    : opt_(options), tok_(tok), metrics_(metrics), svr_(std::make_unique<ExposedServer>()) {
  created_ = static_cast<int64_t>(std::time(nullptr));
  if (!opt_.api_key.empty()) digest(opt_.api_key, key_digest_);
  ConnectionLimits limits;
  limits.max_connections = opt_.max_connections;
  loop_ = std::make_unique<ConnectionLoop>(
      *svr_, limits, [webui = opt_.webui](httplib::Request& req, ConnectionContext& ctx) {
        check_ranges(req, ctx, webui);
      });
  svr_->set_payload_max_length(opt_.max_request_bytes);
  svr_->set_keep_alive_timeout(static_cast<time_t>(limits.idle_timeout_s));
  svr_->set_keep_alive_max_count(static_cast<size_t>(limits.keep_alive_max));
  svr_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return before_body(req, res) ? httplib::Server::HandlerResponse::Handled
                                 : httplib::Server::HandlerResponse::Unhandled;
  });
  svr_->set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    // No response may be sniffed into something else: a JSON error that echoes a decoded path
    // is JSON, not HTML (the page's assets say so too, with their own policy).
    if (!res.has_header("X-Content-Type-Options"))
      res.set_header("X-Content-Type-Options", "nosniff");
    // Keep-Alive says how many requests this connection has left; a connection that closes
    // after this response says so instead.
    ConnectionContext* c = current_connection();
    if (c == nullptr || !res.has_header("Keep-Alive")) return;
    res.headers.erase("Keep-Alive");
    const bool http10_close =
        req.version == "HTTP/1.0" && req.get_header_value("Connection") != "Keep-Alive";
    if (c->close_after || http10_close || c->remaining <= 0) {
      res.set_header("Connection", "close");
    } else {
      res.set_header("Keep-Alive",
                     fmt::format("timeout={}, max={}", static_cast<int>(c->limits->idle_timeout_s),
                                 c->remaining));
    }
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    dispatch(req, res);
  };
  svr_->Get("/.*", handler);
  svr_->Post("/.*", handler);
  svr_->Put("/.*", handler);
  svr_->Patch("/.*", handler);
  svr_->Delete("/.*", handler);
  svr_->Options("/.*", handler);
  // Errors httplib produces itself (unreadable request, body over the cap) get OpenAI's shape.
  svr_->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        const ErrorStyle style = error_style(req.path);
        if (!res.body.empty() || res.content_provider_)
          return httplib::Server::HandlerResponse::Unhandled;
        // A read that passed its deadline, or headers past their cap, reach here as the
        // parser's 400: say what happened instead, and close the connection.
        if (ConnectionContext* c = current_connection();
            c != nullptr && (c->timed_out || c->header_overflow)) {
          c->close_after = true;
          if (c->header_overflow) {
            send_error(res,
                       ApiError(431,
                                fmt::format("the request line and headers exceed {} bytes",
                                            c->limits->max_header_bytes),
                                "invalid_request_error", std::nullopt, "headers_too_large"),
                       style);
          } else {
            send_error(res,
                       ApiError(408,
                                c->phase == ConnectionContext::Phase::headers
                                    ? fmt::format("the request headers did not arrive "
                                                  "within {} s",
                                                  c->limits->header_timeout_s)
                                    : "the request body did not arrive in time (allowed: "
                                      "10 s plus 1 s per 64 KiB declared)",
                                "invalid_request_error", std::nullopt, "request_timeout"),
                       style);
          }
          return httplib::Server::HandlerResponse::Handled;
        }
        const std::string code = res.status == 413   ? "request_too_large"
                                 : res.status == 404 ? "not_found"
                                                     : "bad_request";
        send_error(res,
                   ApiError(res.status, error_message(res.status), "invalid_request_error",
                            std::nullopt, code),
                   style);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr_->set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, "internal error: " + what, "server_error"),
                   error_style(req.path));
      });
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind() {
  opt_.port = loop_->bind(opt_.host, opt_.port);
  return opt_.port;
}

void HttpServer::start() {
  loop_->start();
}

bool HttpServer::before_body(const httplib::Request& req, httplib::Response& res) {
  auto refuse = [&](const ApiError& e) {
    send_error(res, e, error_style(req.path));
    if (ConnectionContext* c = current_connection()) c->close_after = true;  // body unread
    return true;
  };
  // Keeps absurd paths away from httplib's regex router.
  if (req.path.size() > kMaxPath) {
    return refuse(
        ApiError(404, "unknown path", "invalid_request_error", std::nullopt, "not_found"));
  }
  ConnectionContext* c = current_connection();
  if (c != nullptr && c->refusal.status != 0) {
    // Decided before routing (http_connections.cpp: framing; check_ranges: Range).
    const Refusal r = c->refusal;
    if (!r.content_range.empty()) res.set_header("Content-Range", r.content_range);
    const ApiError e(r.status, r.message, "invalid_request_error", std::nullopt, r.code);
    if (r.close) return refuse(e);
    send_error(res, e, error_style(req.path));
    return true;
  }
  if (c != nullptr && c->reserve && normal_path(req.path) != "/health") {
    return refuse(ApiError(503,
                           fmt::format("the server has {} connections open, its limit; past it, "
                                       "only /health is answered; retry shortly",
                                       c->limits->max_connections),
                           "server_error", std::nullopt, "too_many_connections")
                      .with_retry_after(1));
  }
  const std::string te = req.get_header_value("Transfer-Encoding");
  if (req.has_header("Content-Length")) {
    const std::string v = req.get_header_value("Content-Length");
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) {
      return refuse(ApiError(
          400, fmt::format("Content-Length: \"{}\" is not a number of bytes", v.substr(0, 40)),
          "invalid_request_error", std::nullopt, "bad_request"));
    }
    const uint64_t n = std::stoull(v);
    if (n > opt_.max_request_bytes) {
      // Answered now: reading (or skipping) a body this large is what the limit prevents.
      return refuse(ApiError(413,
                             fmt::format("the request body of {} bytes is larger than the server "
                                         "accepts ({} bytes, --max-request-bytes)",
                                         n, opt_.max_request_bytes),
                             "invalid_request_error", std::nullopt, "request_too_large"));
    }
    if (c != nullptr) c->begin_body(n);
  } else if (!te.empty()) {  // chunked: framing_error() refused every other coding
    if (c != nullptr) c->begin_body(opt_.max_request_bytes);
  } else if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
             req.method == "DELETE") {
    // No Content-Length and not chunked: the body is empty (RFC 9112 §6.3). httplib would read
    // until the client closes; answer now instead.
    dispatch(req, res);
    return true;
  }
  return false;
}

void HttpServer::set_ready(Scheduler* scheduler, const ServeLimits& limits) {
  limits_ = limits;
  scheduler_.store(scheduler, std::memory_order_release);
}

void HttpServer::set_stopping() {
  stopping_.store(true);
}

void HttpServer::stop() {
  if (loop_) loop_->stop();
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (opt_.api_key.empty()) return true;
  // Authorization: Bearer KEY (OpenAI's clients, Ollama front ends), or x-api-key: KEY (what
  // Anthropic's clients send).
  const std::string h = req.get_header_value("Authorization");
  std::string token;
  if (h.size() > 7 && (h.compare(0, 7, "Bearer ") == 0 || h.compare(0, 7, "bearer ") == 0))
    token = h.substr(7);
  else if (h.empty())
    token = req.get_header_value("x-api-key");
  while (!token.empty() && token.back() == ' ') token.pop_back();
  // Comparing digests keeps the time independent of where (and whether) the keys differ.
  unsigned char d[32];
  digest(token, d);
  return CRYPTO_memcmp(d, key_digest_, sizeof d) == 0 && !token.empty();
}

json HttpServer::model_object(const std::string& id) const {
  json m;
  m["id"] = id;
  m["object"] = "model";
  m["created"] = created_;
  m["owned_by"] = "deltafin";
  if (scheduler_.load(std::memory_order_acquire) != nullptr) m["context_length"] = limits_.context;
  return m;
}

void HttpServer::dispatch(const httplib::Request& req, httplib::Response& res) {
  if (ConnectionContext* c = current_connection()) c->begin_handling();
  std::string label = "other";
  try {
    route(req, res, label);
  } catch (const grammar::CompileCancelled& e) {
    log_info("[serve] {} {} 499 client closed the connection: {}", req.method, req.path, e.what());
    res.status = 499;  // nobody reads it; counted as "client closed request"
  } catch (const ApiError& e) {
    send_error(res, e, error_style(req.path));
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, fmt::format("internal error: {}", e.what()), "server_error"),
               error_style(req.path));
  }
  if (res.status == -1) res.status = 200;
  metrics_.count_request(label, res.status);
}

void HttpServer::route(const httplib::Request& req, httplib::Response& res, std::string& label) {
  const std::string path = normal_path(req.path);
  if (serve_page(path, req, res)) {
    label = "/ (page)";
    return;
  }
  std::string route, method;
  if (path == "/health" || path == "/metrics" || path == "/v1/models") {
    route = path;
    method = "GET";
  } else if (starts_with(path, "/v1/models/")) {
    route = "/v1/models/{id}";
    method = "GET";
  } else if (path == "/v1/engine/events") {
    route = path;
    method = "GET";
  } else if (path == "/v1/chat/completions" || path == "/v1/completions" ||
             path == "/v1/messages" || path == "/v1/messages/count_tokens" ||
             path == "/v1/responses" || path == "/tokenize" || path == "/detokenize" ||
             path == "/api/chat" || path == "/api/generate" || path == "/api/show" ||
             path == "/api/embed" || path == "/api/embeddings") {
    route = path;
    method = "POST";
  } else if (path == "/api/version" || path == "/api/tags" || path == "/api/ps") {
    route = path;
    method = "GET";
  } else {
    throw ApiError(404, fmt::format("unknown path {}", path.substr(0, 200)),
                   "invalid_request_error", std::nullopt, "not_found");
  }
  label = route;
  const bool method_ok = req.method == method || (method == "GET" && req.method == "HEAD");
  if (!method_ok) {
    res.set_header("Allow", method);
    throw ApiError(405, fmt::format("{} does not take {} (use {})", route, req.method, method),
                   "invalid_request_error", std::nullopt, "method_not_allowed");
  }
  Scheduler* sched = scheduler_.load(std::memory_order_acquire);
  if (route == "/health") {
    if (stopping_.load()) return send_json(res, 503, {{"status", "shutting_down"}});
    if (sched == nullptr) {
      res.set_header("Retry-After", "5");
      return send_json(res, 503, {{"status", "loading"}});
    }
    return send_json(res, 200, {{"status", "ok"}});
  }
  if (!authorized(req)) {
    const bool given = req.has_header("Authorization") || req.has_header("x-api-key");
    throw ApiError(401,
                   given ? "Incorrect API key provided"
                   : error_style(path) == ErrorStyle::anthropic
                       ? "Missing API key: send the header x-api-key: KEY"
                       : "Missing API key: send the header Authorization: Bearer KEY",
                   "invalid_request_error", std::nullopt, "invalid_api_key");
  }
  if (route == "/metrics") {
    res.status = 200;
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
    return;
  }
  if (route == "/v1/engine/events") return engine_events(req, res);
  if (route == "/v1/models") {
    json data = json::array({model_object(opt_.model_id)});
    for (const auto& a : opt_.aliases) {
      if (a != "*" && a != opt_.model_id) data.push_back(model_object(a));
    }
    return send_json(res, 200, {{"object", "list"}, {"data", data}});
  }
  if (route == "/v1/models/{id}") {
    const std::string id = path.substr(std::string("/v1/models/").size());
    if (!model_matches(served(), id)) {
      throw ApiError(
          404,
          fmt::format("The model `{}` does not exist; this server serves `{}`", id, opt_.model_id),
          "invalid_request_error", "model", "model_not_found");
    }
    return send_json(res, 200, model_object(id));
  }
  if (route == "/api/version" || route == "/api/tags" || route == "/api/ps" ||
      route == "/api/show" || route == "/api/embed" || route == "/api/embeddings") {
    return send_json(res, 200, ollama_info(route, req.body, served(), created_));
  }
  ready();
  const json body = parse_body(req.body, limits_.max_json_depth);
  if (route == "/v1/messages/count_tokens")
    return send_json(res, 200, anthropic_count_tokens(body, limits_, tok_));
  if (route == "/tokenize") return send_json(res, 200, tokenize(body, tok_));
  if (route == "/detokenize") return send_json(res, 200, detokenize(body, tok_));
  const bool ollama = route == "/api/chat" || route == "/api/generate";
  if (ollama) {
    if (auto loaded = ollama_load_only(route == "/api/chat", body, limits_))
      return send_json(res, 200, *loaded);
  }
  // Translating the body compiles its schemas, tools and grammars: under one budget, stopped
  // when the client goes away (grammar/budget.h). Closed before the generation starts.
  Translation t = [&] {
    const auto probe = probe_for(req);
    grammar::BudgetOptions o;
    o.cancelled = [&probe] { return probe->closed(); };
    const grammar::CompileBudget budget(std::move(o));
    if (route == "/v1/messages") return anthropic_messages(body, limits_, tok_);
    if (route == "/v1/responses") return responses_create(body, limits_, tok_);
    if (ollama) return ollama_generate(route == "/api/chat", body, limits_, tok_);
    ServeRequest r = route == "/v1/chat/completions"
                         ? parse_chat_request(body, limits_, tok_)
                         : parse_completion_request(body, limits_, tok_);
    auto wire = openai_wire(tok_, r, opt_.model_id);
    return Translation{std::move(r), std::move(wire)};
  }();
  generate(req, res, std::move(t));
}

ServeLimits HttpServer::served() const {
  if (scheduler_.load(std::memory_order_acquire) != nullptr) return limits_;
  ServeLimits names;
  names.model_id = opt_.model_id;
  names.aliases = opt_.aliases;
  return names;
}

Scheduler* HttpServer::ready() const {
  Scheduler* sched = scheduler_.load(std::memory_order_acquire);
  if (stopping_.load())
    throw ApiError(503, "the server is shutting down", "server_error", std::nullopt,
                   "shutting_down");
  if (sched == nullptr) {
    throw ApiError(503, "the model is still loading; retry shortly", "server_error", std::nullopt,
                   "model_loading")
        .with_retry_after(5);
  }
  return sched;
}

bool HttpServer::serve_page(const std::string& path, const httplib::Request& req,
                            httplib::Response& res) {
  if (!opt_.webui) return false;
  if (const WebAsset* file = page_file(path)) {
    const WebAsset& a = *file;
    if (req.method != "GET" && req.method != "HEAD") {
      res.set_header("Allow", "GET");
      throw ApiError(405, fmt::format("{} does not take {} (use GET)", path, req.method),
                     "invalid_request_error", std::nullopt, "method_not_allowed");
    }
    res.status = req.ranges.empty() ? 200 : 206;  // ranges: checked by check_ranges()
    res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
    res.set_header("Accept-Ranges", "bytes");
    res.set_header("Content-Security-Policy", kPagePolicy);
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Cache-Control", "no-cache");
    return true;
  }
  return false;
}

void HttpServer::engine_events(const httplib::Request& req, httplib::Response& res) {
  if (engine_streams_.fetch_add(1) >= kMaxEngineStreams) {
    engine_streams_.fetch_sub(1);
    throw ApiError(429,
                   fmt::format("{} engine event streams are open already; close one (a browser "
                               "tab showing the engine view)",
                               kMaxEngineStreams),
                   "rate_limit_error", std::nullopt, "too_many_streams")
        .with_retry_after(5);
  }
  auto probe = std::shared_ptr<ConnectionProbe>(probe_for(req));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // While the view is open the tracer keeps its recent window (the last passes' spans) for the
  // frames' timeline; the releaser ends the watch with the stream.
  trace_recent_watch(true);
  stream_to(
      req, res, "text/event-stream",
      [this, probe, heat_seen = Metrics::kNoHeatSeen, timeline_seen = int64_t{-1}](
          size_t, httplib::DataSink& sink) mutable {
        nlohmann::ordered_json snapshot = metrics_.engine_snapshot(heat_seen);
        if (auto timeline = engine_timeline_json(timeline_seen); !timeline.is_null())
          snapshot["timeline"] = std::move(timeline);
        const std::string ev = sse(snapshot);
        if (!sink.write(ev.data(), ev.size())) return false;
        // Sleep in short steps, ending when the client or the server goes away.
        for (auto waited = 0ms; waited < kEngineEvery; waited += kPoll) {
          if (stopping_.load() || probe->closed()) {
            sink.done();
            return true;
          }
          std::this_thread::sleep_for(kPoll);
        }
        return true;
      },
      [this](bool) {
        trace_recent_watch(false);
        engine_streams_.fetch_sub(1);
      });
}

namespace {

// What a streamed response's content provider and releaser share.
struct Exchange {
  std::shared_ptr<Job> job;
  Scheduler* sched = nullptr;
  std::unique_ptr<Wire> wire;
  std::unique_ptr<ConnectionProbe> probe;
  std::vector<StepUpdate> early;  // updates taken before the response started
  JobPhase phase = JobPhase::queued;
  bool delivered = false;
  double start = 0;
  std::string what;  // for the log line
};

Outcome outcome(const Job& job) {
  return {job.stop(), job.stop_string(), job.usage()};
}

void write_log_line(const Exchange& x, int status, const char* how) {
  const Usage u = x.job->usage();
  const std::string kept = u.cached_tokens > 0
                               ? fmt::format(" from {} in {:.3f} s", u.cached_from, u.cached_load_s)
                               : "";
  const std::string prompt =
      u.stopped_in_prefill
          ? fmt::format("{} of {} tokens, stopped in prefill", u.prompt_prefilled, u.prompt_tokens)
          : fmt::format("{} tokens", u.prompt_tokens);
  const std::string images =
      u.images > 0 ? fmt::format(", {} image{} ({} encoded in {:.2f} s)", u.images,
                                 u.images == 1 ? "" : "s", u.images_encoded, u.vision_s)
                   : "";
  log_info("[serve] {} {} {}: prompt {} ({} cached{}{}), completion {} tokens, {:.2f} s", x.what,
           status, how, prompt, u.cached_tokens, kept, images, u.completion_tokens,
           now_seconds() - x.start);
}

// The request's log line, once the engine has ended it (a cancelled request ends at the
// engine's next step, which counts what it used).
void log_done(const std::shared_ptr<Exchange>& x, int status, const char* how) {
  x->job->when_settled([x, status, how] { write_log_line(*x, status, how); });
}

}  // namespace

void HttpServer::generate(const httplib::Request& req, httplib::Response& res, Translation t) {
  Scheduler* sched = ready();
  auto x = std::make_shared<Exchange>();
  x->start = now_seconds();
  x->what = req.method + " " + req.path;
  const bool stream = t.request.stream;
  if (t.request.max_tokens_capped)
    res.set_header("X-Deltafin-Max-Tokens", std::to_string(t.request.params.max_new_tokens));
  x->wire = std::move(t.wire);
  x->job = std::make_shared<Job>(std::move(t.request), x->start + opt_.timeout_s, x->start);
  x->sched = sched;
  x->probe = probe_for(req);
  sched->submit(x->job);

  // Wait for the start (streaming) or the end (non-streaming), watching the client.
  for (;;) {
    auto snap = x->job->take(kPoll, x->phase);
    x->phase = snap.phase;
    for (auto& u : snap.updates) x->early.push_back(std::move(u));
    if (snap.phase == JobPhase::failed) {
      log_done(x, snap.error->status(), "failed");
      throw *snap.error;
    }
    if (snap.phase == JobPhase::done || (stream && snap.phase == JobPhase::running)) break;
    if (now_seconds() > x->job->deadline + kHandlerGraceS) {
      sched->cancel(x->job);
      write_log_line(*x, 504, "engine did not answer");  // (it may never end the job)
      throw handler_timeout();
    }
    if (x->probe->closed()) {
      sched->cancel(x->job);
      log_done(x, 499, "client closed the connection");
      res.status = 499;  // nobody reads it; counted as "client closed request"
      return;
    }
  }

  if (!stream) {
    for (const auto& u : x->early) x->wire->add(u);
    x->early.clear();
    auto text = std::make_shared<std::string>(dump(x->wire->response(outcome(*x->job))));
    res.status = 200;
    res.set_content_provider(
        text->size(), "application/json",
        [text](size_t offset, size_t length, httplib::DataSink& sink) {
          return sink.write(text->data() + offset, length);
        },
        [x](bool success) { log_done(x, 200, success ? "ok" : "not delivered"); });
    return;
  }

  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  stream_to(
      req, res, x->wire->stream_type(),  // text/event-stream: httplib never compresses it
      [x](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          return s.empty() || sink.write(s.data(), s.size());
        };
        auto give_up = [&] {
          x->sched->cancel(x->job);
          return false;
        };
        if (!write(x->wire->begin())) return give_up();
        for (const auto& u : x->early) {
          if (!write(x->wire->add(u))) return give_up();
        }
        x->early.clear();
        double last_write = now_seconds();
        for (;;) {
          if (x->phase == JobPhase::done) {
            if (!write(x->wire->end(outcome(*x->job)))) return give_up();
            x->delivered = true;
            sink.done();
            return true;
          }
          auto snap = x->job->take(kPoll, x->phase);
          x->phase = snap.phase;
          for (const auto& u : snap.updates) {
            const std::string out = x->wire->add(u);
            if (!write(out)) return give_up();
            if (!out.empty()) last_write = now_seconds();
          }
          if (snap.phase == JobPhase::failed) {
            // Headers are sent: the error travels in the stream, which then ends.
            if (!write(x->wire->failure(*snap.error))) return give_up();
            sink.done();
            return true;
          }
          if (snap.phase == JobPhase::done) continue;
          if (x->probe->closed()) return give_up();
          if (now_seconds() > x->job->deadline + kHandlerGraceS) {
            x->sched->cancel(x->job);
            if (!write(x->wire->failure(handler_timeout()))) return false;
            x->phase = JobPhase::failed;
            sink.done();
            return true;
          }
          if (now_seconds() - last_write > kKeepAliveS) {
            if (!write(x->wire->keep_alive())) return give_up();
            last_write = now_seconds();
          }
        }
      },
      [x](bool success) {
        if (success && x->delivered) {
          log_done(x, 200, "streamed");
        } else {
          x->sched->cancel(x->job);
          log_done(x, 200,
                   x->phase == JobPhase::failed ? "failed mid-stream" : "stream not delivered");
        }
      });
}

}  // namespace deltafin::server
