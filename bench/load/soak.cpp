// deltafin_soak: the server under mixed, bounded load for a set time (a tool, not a test: it
// runs for tens of minutes). A few closed-loop clients each pick, at random (seeded), one of:
// a plain or streamed completion, a plain or streamed chat turn, a streamed request the client
// abandons after its first event (a cancellation), an invalid request, a streamed request read
// slowly, or a GET of /health, /v1/models or /metrics. Every response is checked for its shape
// (status, OpenAI object fields, SSE framing ending in [DONE], error objects for the invalid
// ones). The server's resident memory, open descriptors and threads are sampled after a warm-up
// (the start), every minute, and after the load stops (the end); the run fails when a response
// had the wrong shape, the server died, or the end exceeds the start by more than the bounds.
//
//   deltafin_soak --deltafin build/src/cli/deltafin [--model DIR] [--duration 1800]
//                 [--clients 3] [--max-tokens 16] [--seed 1] [--rss-growth-mib 64]
//                 [--fd-growth 8] [--thread-growth 4]
// Loopback only. Without --model it makes the tiny synthetic model in a temporary folder.
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "serve_child.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The flags (see the comment at the top).
struct Options {
  double duration = 1800;
  std::string deltafin = "build/src/cli/deltafin";
  std::string model;
  int clients = 3;
  int max_tokens = 16;
  unsigned seed = 1;
  double rss_growth_mib = 64;
  int fd_growth = 8, thread_growth = 4;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "deltafin_soak: %s\nusage: deltafin_soak --deltafin BIN [--model DIR] [--duration "
               "1800] [--clients 3] [--max-tokens 16] [--seed 1] [--rss-growth-mib 64] "
               "[--fd-growth 8] [--thread-growth 4]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  using Set = std::function<void(const std::string&)>;
  const std::map<std::string, Set> flags = {
      {"--deltafin", [&](const std::string& v) { o.deltafin = v; }},
      {"--model", [&](const std::string& v) { o.model = v; }},
      {"--duration", [&](const std::string& v) { o.duration = std::stod(v); }},
      {"--clients", [&](const std::string& v) { o.clients = std::stoi(v); }},
      {"--max-tokens", [&](const std::string& v) { o.max_tokens = std::stoi(v); }},
      {"--seed", [&](const std::string& v) { o.seed = static_cast<unsigned>(std::stoul(v)); }},
      {"--rss-growth-mib", [&](const std::string& v) { o.rss_growth_mib = std::stod(v); }},
      {"--fd-growth", [&](const std::string& v) { o.fd_growth = std::stoi(v); }},
      {"--thread-growth", [&](const std::string& v) { o.thread_growth = std::stoi(v); }},
  };
  for (int i = 1; i < argc; i += 2) {
    const auto it = flags.find(argv[i]);
    if (it == flags.end()) usage(std::string("unknown argument ") + argv[i]);
    if (i + 1 >= argc) usage(std::string("missing value for ") + argv[i]);
    try {
      it->second(argv[i + 1]);
    } catch (const std::logic_error&) {
      usage(std::string("not a number: ") + argv[i] + " " + argv[i + 1]);
    }
  }
  if (o.duration <= 0 || o.clients < 1 || o.max_tokens < 1)
    usage("--duration, --clients and --max-tokens must be positive");
  return o;
}

struct Sample {
  double t = 0;
  double rss_mib = 0;
  int fds = 0, threads = 0;
};

Sample sample(pid_t pid, double t) {
  Sample s;
  s.t = t;
  std::ifstream st(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoi(line.substr(8));
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++s.fds;
  return s;
}

// The `data:` payloads of an SSE body; empty when the framing is wrong or [DONE] is missing.
std::vector<json> sse(const std::string& body, bool* ok) {
  std::vector<json> out;
  *ok = false;
  size_t p = 0;
  while (p < body.size()) {
    const size_t end = body.find("\n\n", p);
    if (end == std::string::npos) return out;
    const std::string frame = body.substr(p, end - p);
    p = end + 2;
    if (!frame.empty() && frame[0] == ':') continue;  // comment (keep-alive)
    if (frame.rfind("data: ", 0) != 0) return out;
    const std::string data = frame.substr(6);
    if (data == "[DONE]") {
      *ok = p == body.size();
      return out;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) return out;
    out.push_back(std::move(j));
  }
  return out;
}

bool is_error(const json& j) {
  return j.is_object() && j.contains("error") && j["error"].is_object() &&
         j["error"].contains("message") && j["error"]["message"].is_string() &&
         j["error"].contains("type");
}

// Checks one finished non-streamed generation.
bool plain_ok(const httplib::Result& r, bool chat, int max_tokens) {
  if (!r || r->status != 200) return false;
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || j.value("object", "") != (chat ? "chat.completion" : "text_completion"))
    return false;
  if (!j.contains("choices") || j["choices"].size() != 1) return false;
  const json& c = j["choices"][0];
  const std::string fin = c.value("finish_reason", "");
  if (fin != "stop" && fin != "length") return false;
  if (chat ? !(c["message"].value("role", "") == "assistant") : !c["text"].is_string())
    return false;
  const int64_t n = j["usage"].value("completion_tokens", -1);
  return n >= 0 && n <= max_tokens && j["usage"].value("prompt_tokens", 0) > 0;
}

bool stream_ok(const std::string& body, bool chat) {
  bool framed = false;
  const auto events = sse(body, &framed);
  if (!framed || events.empty()) return false;
  bool finished = false;
  for (const auto& e : events) {
    if (e.value("object", "") != (chat ? "chat.completion.chunk" : "text_completion")) return false;
    if (e.contains("choices") && !e["choices"].empty() &&
        !e["choices"][0]["finish_reason"].is_null())
      finished = true;
  }
  return finished;
}

enum Kind { kPlain, kStream, kChat, kChatStream, kCancel, kInvalid, kSlow, kGet, kKinds };
const char* kNames[] = {"completion", "completion-stream", "chat",        "chat-stream",
                        "cancel",     "invalid",           "slow-reader", "get"};

struct Counts {
  std::atomic<int64_t> ok{0}, bad{0};
};

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Options o = parse(argc, argv);
  const deltafin::bench::TinyModelIfNone tiny(o.model, "soak-model");
  deltafin::bench::ServeChild srv(
      o.deltafin, o.model,
      {"--parallel", "2", "--queue", std::to_string(o.clients + 2), "--timeout", "120"}, "soak");
  fmt::print("deltafin_soak: model {}, {} clients, max_tokens {}, {:.0f} s, seed {}\n", o.model,
             o.clients, o.max_tokens, o.duration, o.seed);
  std::fflush(stdout);

  Counts counts[kKinds];
  std::mutex bad_mu;
  std::vector<std::string> bad_examples;
  const auto t0 = Clock::now();
  const auto stop_at = t0 + std::chrono::duration<double>(o.duration);
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::vector<std::thread> clients;
  for (int c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(o.seed * 7919u + static_cast<unsigned>(c));
      httplib::Client cli("127.0.0.1", srv.port);
      cli.set_read_timeout(300, 0);
      for (int n = 0; Clock::now() < stop_at; ++n) {
        const Kind k = static_cast<Kind>(rng() % kKinds);
        const std::string text = fmt::format("Client {} request {}: the sea and the king.", c, n);
        const bool chat = k == kChat || k == kChatStream || (k == kSlow && rng() % 2 == 0);
        json body = chat ? json{{"messages", {{{"role", "user"}, {"content", text}}}},
                                {"thinking", rng() % 2 == 0}}
                         : json{{"prompt", text}};
        body["max_tokens"] = static_cast<int>(1 + rng() % static_cast<unsigned>(o.max_tokens));
        body["temperature"] = 0.8;
        body["seed"] = static_cast<int>(rng() % 100000);
        const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
        bool ok = false;
        std::string seen;  // the start of a streamed body, shown when its shape is wrong
        if (k == kPlain || k == kChat) {
          ok = plain_ok(cli.Post(path, body.dump(), "application/json"), chat, o.max_tokens);
        } else if (k == kStream || k == kChatStream || k == kSlow || k == kCancel) {
          body["stream"] = true;
          std::string got;
          httplib::Request req;
          req.method = "POST";
          req.path = path;
          req.headers = {{"Content-Type", "application/json"}};
          req.body = body.dump();
          req.content_receiver = [&](const char* d, size_t l, uint64_t, uint64_t) {
            got.append(d, l);
            if (k == kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(150));
            // A cancellation: hang up once the first event arrived.
            return !(k == kCancel && got.find("\n\n") != std::string::npos);
          };
          auto r = cli.send(req);
          seen = got.substr(0, 120);
          if (k == kCancel) {
            // The stream began (an event, or a keep-alive comment while queued), then we left.
            ok = got.rfind("data: ", 0) == 0 || got.rfind(": ", 0) == 0;
          } else {
            ok = r && r->status == 200 && stream_ok(got, chat);
          }
        } else if (k == kInvalid) {
          static const char* kBad[] = {
              "{",
              R"({"prompt": "x", "max_tokens": -1})",
              R"({"messages": "not a list"})",
              R"({"prompt": "x", "no_such_field": 1})",
              R"([1, 2, 3])",
              R"({"messages": [{"role": "wizard", "content": "x"}]})",
          };
          const auto r = cli.Post(rng() % 2 ? "/v1/completions" : "/v1/chat/completions",
                                  kBad[rng() % 6], "application/json");
          ok = r && r->status == 400 && is_error(json::parse(r->body, nullptr, false));
        } else {
          static const char* kPaths[] = {"/health", "/v1/models", "/metrics"};
          const auto r = cli.Get(kPaths[rng() % 3]);
          ok = r && r->status == 200 && !r->body.empty();
        }
        (ok ? counts[k].ok : counts[k].bad)++;
        if (!ok) {
          std::lock_guard<std::mutex> l(bad_mu);
          if (bad_examples.size() < 10)
            bad_examples.push_back(fmt::format("{} at {:.0f} s: {:?}", kNames[k], since(), seen));
        }
      }
    });
  }

  // Samples: the start after a warm-up (first requests fill caches and the connection pool),
  // then once a minute; the end after the clients stopped and the server settled.
  const double warmup = std::min(60.0, o.duration / 10);
  std::vector<Sample> samples;
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  samples.push_back(sample(srv.pid, since()));
  while (Clock::now() < stop_at) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (since() - samples.back().t >= 60) samples.push_back(sample(srv.pid, since()));
  }
  for (auto& t : clients) t.join();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const Sample end = sample(srv.pid, since());
  samples.push_back(end);
  const Sample& start = samples.front();

  fmt::print("{:>8} {:>10} {:>5} {:>8}\n", "t (s)", "RSS (MiB)", "fds", "threads");
  for (const auto& s : samples)
    fmt::print("{:>8.0f} {:>10.1f} {:>5} {:>8}\n", s.t, s.rss_mib, s.fds, s.threads);
  int64_t total_ok = 0, total_bad = 0;
  for (int k = 0; k < kKinds; ++k) {
    fmt::print("{:>18}: {:>6} ok, {} with the wrong shape\n", kNames[k], counts[k].ok.load(),
               counts[k].bad.load());
    total_ok += counts[k].ok.load();
    total_bad += counts[k].bad.load();
  }
  for (const auto& e : bad_examples) fmt::print("  wrong shape: {}\n", e);
  const bool alive = kill(srv.pid, 0) == 0;
  const double rss_growth = end.rss_mib - start.rss_mib;
  const bool grew = rss_growth > o.rss_growth_mib || end.fds - start.fds > o.fd_growth ||
                    end.threads - start.threads > o.thread_growth;
  const int exit_code = srv.stop();
  fmt::print(
      "{} requests, {} with the wrong shape; RSS {:.1f} -> {:.1f} MiB ({:+.1f}, bound {:+.0f}), "
      "fds {} -> {} (bound +{}), threads {} -> {} (bound +{}); server {} and exited {}\n",
      total_ok + total_bad, total_bad, start.rss_mib, end.rss_mib, rss_growth, o.rss_growth_mib,
      start.fds, end.fds, o.fd_growth, start.threads, end.threads, o.thread_growth,
      alive ? "alive" : "DEAD", exit_code);
  const bool pass = total_bad == 0 && alive && !grew && exit_code == 0;
  fmt::print("deltafin_soak: {}\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
