// Fuzz bodies for what an HTTP client sends: the request translators and validator (request: a
// body for the OpenAI, Anthropic Messages, OpenAI Responses or Ollama endpoints, with the real
// test tokenizer) and whole HTTP requests
// through the server's own entry point (http).
//
// The http target runs the real HttpServer in this process, on a loopback port, ready over a
// Scheduler with the tiny test model (mmap, one thread, at most 4 new tokens, so a valid
// generation request costs milliseconds). Each input is sent as the bytes of one connection
// (see exchange()); the server must answer or close within kAnswerSeconds, and must still answer
// GET /health afterwards — a bad request may never harm the next one. Two servers share the
// scheduler, one without and one with an API key, so both the open and the authenticated paths
// are reached (the first input byte picks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures/synthetic_tokenizer.h"
#include "fuzz_targets.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/ollama_api.h"
#include "server/request.h"
#include "server/responses_api.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::fuzz {

namespace {

const Tokenizer& request_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test_data_dir() + "/tokenizer");
  return tok;
}

server::ServeLimits limits_for(const Tokenizer& tok, int64_t vocab) {
  server::ServeLimits l;
  l.model_id = "kimi-k3";
  l.aliases = {"tiny"};
  l.context = 512;
  l.max_tokens = 4;
  l.vocab = vocab;
  l.stop_ids = {tok.special_id(kEndOfMsgMarker).value()};
  l.prefill_chunk = 64;
  return l;
}

// The live servers of the http target (built on first use, never torn down: the process ends).
struct LiveServers {
  Tokenizer tok;
  std::unique_ptr<LoadedModel> model;
  server::Metrics metrics;
  std::unique_ptr<PrefixStore> store;
  std::unique_ptr<server::Scheduler> scheduler;
  std::unique_ptr<server::HttpServer> open, keyed;
  int open_port = 0, keyed_port = 0;
};

LiveServers& live() {
  static LiveServers* s = [] {
    std::signal(SIGPIPE, SIG_IGN);
    const std::string tok_dir = scratch_dir() + "/http-tokenizer";
    std::filesystem::create_directories(tok_dir);
    write_synthetic_tokenizer(tok_dir, 512);  // the tiny model's vocabulary
    auto* l = new LiveServers{Tokenizer::load(tok_dir)};
    EngineOptions eo;
    eo.model = test_data_dir() + "/k3-tiny-mxfp4/model";
    eo.mmap = true;
    eo.threads = 1;
    l->model = load_model(eo);
    server::SchedulerOptions so;
    so.parallel = 1;
    so.queue = 4;
    // Reuse in RAM only: a fuzz run writes no snapshot files.
    PrefixStoreOptions po;
    po.ram_bytes = 64ull << 20;
    po.model_id = "fuzz";
    l->store = std::make_unique<PrefixStore>(l->model->config(), po);
    so.store = l->store.get();
    l->scheduler = std::make_unique<server::Scheduler>(*l->model, l->tok, so, l->metrics);
    const server::ServeLimits limits = limits_for(l->tok, l->model->config().vocab);
    server::HttpOptions ho;
    ho.port = 0;
    ho.max_connections = 8;
    ho.timeout_s = 10;
    ho.max_request_bytes = 1 << 20;
    l->open = std::make_unique<server::HttpServer>(ho, l->tok, l->metrics);
    ho.api_key = "fuzz-key";
    l->keyed = std::make_unique<server::HttpServer>(ho, l->tok, l->metrics);
    l->open_port = l->open->bind();
    l->keyed_port = l->keyed->bind();
    l->open->start();
    l->keyed->start();
    l->open->set_ready(l->scheduler.get(), limits);
    l->keyed->set_ready(l->scheduler.get(), limits);
    l->metrics.set_ready(true);
    // The servers are never torn down, but at exit the engine thread must end before the static
    // thread pool it computes on is destroyed: a request cancelled by the last input may still be
    // in a forward pass then (ASan saw a use after free of the pool under load). Handlers run
    // before the statics constructed earlier (the pool) are destroyed.
    std::atexit([] { live().scheduler->stop(); });
    return l;
  }();
  return *s;
}

// Sends `bytes` on a fresh connection and reads what comes back until the server closes it.
// Once the server has been quiet for 200 ms (waiting for more of an incomplete request, or
// for the next one on a kept-alive connection) the client half-closes, which ends the wait at
// once (httplib treats a half-closed client as gone, so a request still being answered at that
// point is cancelled, as for any client that leaves). `answered` is false when the server
// neither closed nor stopped talking within kAnswerSeconds.
//
// kAnswerSeconds is a hang detector, not a latency bound: a correct server closes at once after
// the half-close. It was 10 s until a run at nice 15 on the shared 2-core machine (load ~13, an
// execution a second) was starved past it once; that input (tests/data/fuzz/http/
// crash-starved-models-request) replays in under 2 s, alone and after the whole corpus. 25 s
// stays below libFuzzer's -timeout=30 (tools/fuzz.sh), so a real hang is still reported.
constexpr int kAnswerSeconds = 25;

std::string exchange(int port, const std::string& bytes, bool* answered) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  fuzz_check(fd >= 0, "socket() failed");
  timeval tv{kAnswerSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  fuzz_check(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0,
             "cannot connect to the server");
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (an oversize declaration, say)
    sent += static_cast<size_t>(n);
  }
  std::string out;
  char buf[4096];
  bool half_closed = false;
  *answered = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kAnswerSeconds);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) == 0) {
      if (!half_closed) ::shutdown(fd, SHUT_WR);
      half_closed = true;
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *answered = true;  // closed (or reset)
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

// First byte: bits 1-2 pick the API (OpenAI, Anthropic Messages, OpenAI Responses, Ollama),
// bit 0 the endpoint within it (chat or completions; messages or count_tokens; -; chat or
// generate). The rest is the JSON body. Whatever the translation accepts must be a request the
// engine can run within the limits.
void request(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const Tokenizer& tok = request_tokenizer();
  const auto limits = limits_for(tok, tok.vocab_size());
  const bool first = (data[0] & 1) == 0;
  const int api = (data[0] >> 1) & 3;
  try {
    const auto body = server::parse_body(
        std::string(reinterpret_cast<const char*>(data + 1), size - 1), limits.max_json_depth);
    server::ServeRequest r;
    if (api == 0) {
      r = first ? server::parse_chat_request(body, limits, tok)
                : server::parse_completion_request(body, limits, tok);
    } else if (api == 1 && !first) {
      const auto n = server::anthropic_count_tokens(body, limits, tok)["input_tokens"];
      fuzz_check(n.is_number_integer() && n.get<int64_t>() > 0, "count_tokens counted nothing");
      return;
    } else if (api == 1) {
      r = std::move(server::anthropic_messages(body, limits, tok).request);
    } else if (api == 2) {
      r = std::move(server::responses_create(body, limits, tok).request);
    } else {
      if (server::ollama_load_only(first, body, limits)) return;
      r = std::move(server::ollama_generate(first, body, limits, tok).request);
    }
    fuzz_check(!r.prompt.empty(), "an accepted request has an empty prompt");
    for (int32_t id : r.prompt)
      fuzz_check(id >= 0 && id < limits.vocab, "an accepted prompt id is outside the vocabulary");
    fuzz_check(r.params.max_new_tokens >= 0 && r.params.max_new_tokens <= limits.max_tokens,
               "an accepted max_tokens exceeds the server's ceiling");
    fuzz_check(static_cast<int64_t>(r.prompt.size()) <= limits.context,
               "an accepted prompt does not fit the context");
    for (const auto& [id, bias] : r.logit_bias)
      fuzz_check(id >= 0 && id < limits.vocab, "an accepted logit_bias id is out of range");
  } catch (const server::ApiError& e) {
    fuzz_check(e.status() >= 400 && e.status() < 500, "a bad request got a non-4xx status");
  }
}

// First byte: bit 0 picks the server with an API key. The rest is sent as is.
void http(const uint8_t* data, size_t size) {
  if (size == 0) return;
  LiveServers& s = live();
  const int port = (data[0] & 1) != 0 ? s.keyed_port : s.open_port;
  bool answered = false;
  const std::string reply =
      exchange(port, std::string(reinterpret_cast<const char*>(data + 1), size - 1), &answered);
  fuzz_check(answered, "the server neither answered nor closed the connection in time");
  if (!reply.empty())
    fuzz_check(reply.rfind("HTTP/1.", 0) == 0, "the server's reply is not an HTTP response");
  const std::string health = exchange(
      s.open_port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &answered);
  if (!answered || health.rfind("HTTP/1.1 200", 0) != 0)
    std::fprintf(stderr, "GET /health answered %s:\n%s\n", answered ? "yes" : "no (timed out)",
                 health.substr(0, 400).c_str());
  fuzz_check(answered && health.rfind("HTTP/1.1 200", 0) == 0,
             "GET /health does not answer 200 after a fuzzed request");
}

}  // namespace deltafin::fuzz
