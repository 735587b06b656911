// Server test harness (see server_util.h).
#include "server_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "fixtures/synthetic.h"
#include "test_util.h"

extern char** environ;

namespace deltafin::test {

bool run_node_test(const std::string& dir, const std::string& package, const std::string& env,
                   const std::string& script, std::string& out, int& exit_code) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(DELTAFIN_TEST_DATA).parent_path() / dir;
  if (!fs::exists(d / "node_modules" / package / "package.json")) {
    // `make test` installs these first; a bare ctest -j2 can start two tests of the same folder
    // at once, and `npm ci` removes node_modules before it installs: one installs, under a lock,
    // and the other finds the result.
    const int lock = ::open((d / ".npm-install.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    bool failed = false;
    if (!fs::exists(d / "node_modules" / package / "package.json")) {
      const std::string cmd =
          "cd '" + d.string() + "' && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1";
      failed = std::system(cmd.c_str()) != 0;
    }
    if (lock >= 0) ::close(lock);
    if (failed) {
      out = "npm ci failed in " + d.string();
      return false;
    }
  }
  const std::string cmd = "cd '" + d.string() + "' && " + env + " node " + script + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    out = "cannot run " + cmd;
    return false;
  }
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

namespace {

// One run of family_test.mjs in `phase`; its "answers: ..." line ("" on failure, the test failed).
std::string family_client_answers(const ServerProcess& srv, const std::string& model_id,
                                  const std::string& phase, bool check) {
  std::string out;
  int code = -1;
  EXPECT_TRUE(run_node_test("api_clients", "@anthropic-ai/sdk",
                            "DELTAFIN_BASE_URL=" + srv.base_url() +
                                " DELTAFIN_API_KEY=sk-test DELTAFIN_MODEL=" + model_id +
                                " FAMILY_PHASE=" + phase + " REUSE_CHECK=" + (check ? "1" : "0"),
                            "family_test.mjs", out, code))
      << out;
  EXPECT_EQ(code, 0) << out << "\n" << srv.err();
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  const size_t p = out.find("answers: ");
  if (code != 0 || p == std::string::npos) return "";
  return out.substr(p, out.find('\n', p) - p);
}

}  // namespace

void expect_family_clients_reuse_state(const std::string& model_dir, const std::string& model_id) {
  if (std::system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "node/npm not installed";
  const std::vector<std::string> common = {"--threads", "2",          "--api-key",
                                           "sk-test",   "--model-id", model_id};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };
  {
    // Every answer scripted to one K2-format call (the test hook of server/scheduler.h).
    setenv("DELTAFIN_DEBUG_SCRIPT",
           "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           "<|tool_call_argument_begin|>{\"city\":\"Paris\"}<|tool_call_end|>"
           "<|tool_calls_section_end|><|im_end|>",
           1);
    ServerProcess srv(with({"--state-cache", "none"}), model_dir);
    unsetenv("DELTAFIN_DEBUG_SCRIPT");
    ASSERT_TRUE(srv.ready()) << srv.err();
    family_client_answers(srv, model_id, "calls", true);
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
  const std::string states = temp_dir("family-states") + "/states";
  std::string reusing;
  {
    ServerProcess srv(with({"--state-cache", states}), model_dir);
    ASSERT_TRUE(srv.ready()) << srv.err();
    reusing = family_client_answers(srv, model_id, "turns", true);
    ASSERT_FALSE(reusing.empty());
    EXPECT_EQ(srv.stop(), 0) << srv.err();
  }
  ServerProcess fresh(with({"--state-cache", "none"}), model_dir);
  ASSERT_TRUE(fresh.ready()) << fresh.err();
  EXPECT_EQ(family_client_answers(fresh, model_id, "turns", false), reusing);
  EXPECT_EQ(fresh.stop(), 0) << fresh.err();
}

const Tokenizer& k3_tokenizer() {
  static const Tokenizer t = Tokenizer::load(data_dir() + "/tokenizer");
  return t;
}

server::ServeLimits k3_limits(int64_t context, int64_t max_tokens) {
  server::ServeLimits l;
  l.context = context;
  l.max_tokens = max_tokens;
  l.vocab = k3_tokenizer().vocab_size();
  l.stop_ids = {*k3_tokenizer().special_id("<|end_of_msg|>")};
  return l;
}

void force_output(Generation& g, const std::string& output,
                  const std::function<void(const server::StepUpdate&)>& step) {
  const auto ids = k3_tokenizer().encode_with_special(output);
  std::vector<float> logits(static_cast<size_t>(k3_tokenizer().vocab_size()), 0.0f);
  size_t next = 0, sent = 0;
  while (!g.finished()) {
    // Prompt passes ignore their logits; every sampling pass picks the next forced id.
    std::fill(logits.begin(), logits.end(), 0.0f);
    if (next < ids.size()) logits[static_cast<size_t>(ids[next])] = 50.0f;
    const size_t before = g.tokens().size();
    g.on_logits(logits);
    if (g.tokens().size() > before) ++next;
    server::StepUpdate u;
    u.events = g.take_events();
    u.tokens.assign(g.tokens().begin() + static_cast<ptrdiff_t>(sent), g.tokens().end());
    sent = g.tokens().size();
    step(u);
  }
}

const std::string& server_model_dir() {
  static const std::string dir = [] {
    const std::string d = temp_dir("serve-model") + "/model";
    SyntheticSpec spec = synthetic_preset("tiny");
    make_model(d, spec);
    return d;
  }();
  return dir;
}

ServerProcess::ServerProcess(std::vector<std::string> args, const std::string& model) {
  signal(SIGPIPE, SIG_IGN);
  int err_pipe[2];
  if (pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
  posix_spawn_file_actions_addclose(&fa, err_pipe[1]);
  std::vector<std::string> full = {binary(), "serve", "--port", "0"};
  if (model != kNoModel) {
    full.push_back("--model");
    full.push_back(model.empty() ? server_model_dir() : model);
  }
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, full[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(err_pipe[1]);
  if (rc != 0) {
    close(err_pipe[0]);
    throw std::runtime_error("cannot spawn " + full[0]);
  }
  err_fd_ = err_pipe[0];
  reader_ = std::thread([this] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(err_fd_, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(m_);
      err_.append(buf, static_cast<size_t>(n));
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  const std::string listening = "listening on http://127.0.0.1:";
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(m_);
      const size_t at = err_.find(listening);
      if (err_.find("ready:") != std::string::npos && at != std::string::npos) {
        port_ = std::atoi(err_.c_str() + at + listening.size());
        return;
      }
    }
    if (!running()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServerProcess::~ServerProcess() {
  stop();
  if (reader_.joinable()) reader_.join();
  if (err_fd_ >= 0) close(err_fd_);
}

bool ServerProcess::running() const {
  if (pid_ <= 0) return false;
  return kill(pid_, 0) == 0 && waitpid(pid_, nullptr, WNOHANG) == 0;
}

std::string ServerProcess::err() const {
  std::lock_guard<std::mutex> lock(m_);
  return err_;
}

int ServerProcess::stop(double grace_s) {
  if (pid_ <= 0) return exit_code_;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (r < 0) {
      status = 0;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  pid_ = -1;
  return exit_code_;
}

std::unique_ptr<httplib::Client> ServerProcess::client(int read_timeout_s) const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
  c->set_read_timeout(read_timeout_s, 0);
  c->set_write_timeout(30, 0);
  c->set_connection_timeout(10, 0);
  return c;
}

namespace {
HttpResult result_of(const httplib::Result& r) {
  HttpResult out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  out.j = json::parse(r->body, nullptr, false);
  if (out.j.is_discarded()) out.j = nullptr;
  return out;
}
}  // namespace

HttpResult post_json(httplib::Client& c, const std::string& path, const json& body,
                     const httplib::Headers& headers) {
  return result_of(c.Post(path.c_str(), headers, body.dump(), "application/json"));
}

void prime_client(const ServerProcess& srv) {
  auto c = srv.client();
  get(*c, "/health");
}

std::vector<nlohmann::json> concurrent_completions(ServerProcess& srv,
                                                   const std::vector<std::string>& prompts,
                                                   int max_tokens) {
  std::vector<nlohmann::json> out(prompts.size());
  prime_client(srv);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      auto c = srv.client();
      json body = {{"model", "kimi-k3"},
                   {"prompt", json::parse("[" + prompts[i] + "]")},
                   {"max_tokens", max_tokens},
                   {"temperature", 0}};
      out[i] = post_json(*c, "/v1/completions", body).j;
    });
  }
  for (auto& t : clients) t.join();
  return out;
}

HttpResult get(httplib::Client& c, const std::string& path, const httplib::Headers& headers) {
  return result_of(c.Get(path.c_str(), headers));
}

std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated SSE frame: " << body.substr(pos);
      break;
    }
    const std::string frame = body.substr(pos, end - pos);
    pos = end + 2;
    if (!frame.empty() && frame[0] == ':') continue;
    if (frame.rfind("data: ", 0) != 0 || frame.find('\n') != std::string::npos) {
      ADD_FAILURE() << "bad SSE frame: " << frame;
      continue;
    }
    out.push_back(frame.substr(6));
  }
  EXPECT_FALSE(out.empty());
  if (!out.empty()) {
    EXPECT_EQ(out.back(), "[DONE]");
  }
  return out;
}

bool is_error_shape(const json& j) {
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return false;
  const json& e = j["error"];
  return e.contains("message") && e["message"].is_string() &&
         !e["message"].get<std::string>().empty() && e.contains("type") && e["type"].is_string() &&
         e.contains("param") && e.contains("code");
}

RawClient::RawClient(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd_);
    fd_ = -1;
  }
}

RawClient::~RawClient() {
  close_now();
}

bool RawClient::send_request(const std::string& method, const std::string& path,
                             const std::string& body) {
  if (fd_ < 0) return false;
  const std::string req = method + " " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = ::send(fd_, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string RawClient::read_until(const std::string& needle, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (fd_ >= 0 && got_.find(needle) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) break;
    got_.append(buf, static_cast<size_t>(n));
  }
  return got_;
}

void RawClient::close_now() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace deltafin::test
