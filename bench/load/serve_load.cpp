// deltafin_serve_load: a load test for `deltafin serve` (a benchmark, not a test: it reports,
// it asserts nothing). For each --parallel value it starts the real server on a free loopback
// port, runs --clients closed-loop clients for --duration seconds (each sends a streamed
// request, reads it to the end, and sends the next), lets the requests in flight finish, stops
// the server, and prints requests/s, latency p50/p99, time to first token p50/p99 and the
// aggregate generated tokens/s. Loopback only and bounded in time, so it is safe to run
// anywhere; without --model it makes the tiny synthetic model in a temporary folder.
//
//   deltafin_serve_load --deltafin build/src/cli/deltafin [--model DIR] [--parallel 1,4]
//                       [--clients 8] [--duration 20] [--max-tokens 32] [--endpoint
//                       completions|chat]
#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_child.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string deltafin = "build/src/cli/deltafin";
  std::string model;
  std::vector<int> parallel = {1, 4};
  int clients = 8;
  double duration = 20;
  int max_tokens = 32;
  std::string endpoint = "completions";
  std::string threads;  // passed to serve --threads
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "deltafin_serve_load: %s\nusage: deltafin_serve_load --deltafin BIN [--model DIR] "
               "[--parallel 1,4] "
               "[--clients 8] [--duration 20] [--max-tokens 32] [--endpoint completions|chat] "
               "[--threads N]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--deltafin")
      o.deltafin = val();
    else if (a == "--model")
      o.model = val();
    else if (a == "--clients")
      o.clients = std::stoi(val());
    else if (a == "--duration")
      o.duration = std::stod(val());
    else if (a == "--max-tokens")
      o.max_tokens = std::stoi(val());
    else if (a == "--endpoint")
      o.endpoint = val();
    else if (a == "--threads")
      o.threads = val();
    else if (a == "--parallel") {
      o.parallel.clear();
      std::string s = val();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        o.parallel.push_back(std::stoi(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else
      usage(("unknown argument " + a).c_str());
  }
  if (o.endpoint != "completions" && o.endpoint != "chat") usage("--endpoint: completions or chat");
  if (o.clients < 1 || o.duration <= 0 || o.max_tokens < 1)
    usage("--clients, --duration and --max-tokens must be positive");
  return o;
}

// The server as a child process (serve_child.h) with this run's --parallel and queue.
struct Server : deltafin::bench::ServeChild {
  Server(const Options& o, int parallel)
      : ServeChild(o.deltafin, o.model, extra_args(o, parallel),
                   fmt::format("serve-load-{}", parallel)) {}
  static std::vector<std::string> extra_args(const Options& o, int parallel) {
    std::vector<std::string> args = {"--parallel", std::to_string(parallel), "--queue",
                                     std::to_string(o.clients)};
    if (!o.threads.empty()) {
      args.push_back("--threads");
      args.push_back(o.threads);
    }
    return args;
  }
};

struct Sample {
  double latency = 0, ttft = 0;
  int64_t tokens = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

void run_one(const Options& o, int parallel) {
  Server srv(o, parallel);
  std::mutex m;
  std::vector<Sample> samples;
  std::atomic<int> failures{0};
  const auto t0 = Clock::now();
  const auto stop_at = t0 + std::chrono::duration<double>(o.duration);
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client cli("127.0.0.1", srv.port);
      cli.set_read_timeout(600, 0);
      int n = 0;
      while (Clock::now() < stop_at) {
        json body;
        const std::string text =
            fmt::format("Client {} request {}: tell me a story about the sea.", c, n++);
        if (o.endpoint == "chat") {
          body = {{"messages", json::array({{{"role", "user"}, {"content", text}}})},
                  {"thinking", false}};
        } else {
          body = {{"prompt", text}};
        }
        body["max_tokens"] = o.max_tokens;
        body["temperature"] = 0.8;
        body["seed"] = c * 1000 + n;
        body["stream"] = true;
        body["stream_options"] = {{"include_usage", true}};
        httplib::Request req;
        req.method = "POST";
        req.path = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = body.dump();
        std::string got;
        double first = 0;
        const auto start = Clock::now();
        req.content_receiver = [&](const char* d, size_t l, uint64_t, uint64_t) {
          got.append(d, l);
          // The first event carrying text (chat's first chunk is the role).
          if (first == 0 &&
              (got.find("\"text\":\"") != std::string::npos ||
               got.find("\"content\":\"") != std::string::npos) &&
              (o.endpoint != "chat" ||
               got.find("\"content\":\"\"") != got.rfind("\"content\":\""))) {
            first = std::chrono::duration<double>(Clock::now() - start).count();
          }
          return true;
        };
        auto res = cli.send(req);
        const double latency = std::chrono::duration<double>(Clock::now() - start).count();
        if (!res || res->status != 200 || got.find("data: [DONE]") == std::string::npos) {
          ++failures;
          continue;
        }
        int64_t tokens = 0;
        const size_t u = got.rfind("\"usage\":{");
        if (u != std::string::npos) {
          const size_t ct = got.find("\"completion_tokens\":", u);
          if (ct != std::string::npos) tokens = std::stoll(got.substr(ct + 20));
        }
        std::lock_guard<std::mutex> lock(m);
        samples.push_back({latency, first > 0 ? first : latency, tokens});
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> lat, ttft;
  int64_t tokens = 0;
  for (const auto& s : samples) {
    lat.push_back(s.latency);
    ttft.push_back(s.ttft);
    tokens += s.tokens;
  }
  fmt::print(
      "parallel {:>2}: {:>4} requests ({} failed) in {:.1f} s: {:.2f} requests/s, latency p50 "
      "{:.3f} s p99 {:.3f} s, "
      "first token p50 {:.3f} s p99 {:.3f} s, {:.1f} generated tokens/s aggregate\n",
      parallel, samples.size(), failures.load(), wall, static_cast<double>(samples.size()) / wall,
      percentile(lat, 0.5), percentile(lat, 0.99), percentile(ttft, 0.5), percentile(ttft, 0.99),
      static_cast<double>(tokens) / wall);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Options o = parse(argc, argv);
  const deltafin::bench::TinyModelIfNone tiny(o.model, "serve-load-model");
  fmt::print(
      "deltafin_serve_load: model {}, {} clients, {} endpoint, max_tokens {}, {:.0f} s per "
      "setting, {} hardware threads\n",
      o.model, o.clients, o.endpoint, o.max_tokens, o.duration,
      std::thread::hardware_concurrency());
  for (int p : o.parallel) run_one(o, p);
  return 0;
}
