#include "test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scoped_env.h"

extern char** environ;

namespace deltafin::test {

SyntheticSpec small_k3_spec() {
  SyntheticSpec s = synthetic_preset("k3");
  s.layers = 4;
  s.experts = 16;
  s.top_k = 4;
  s.hidden = 256;
  s.latent = 128;
  s.moe_intermediate = 64;
  s.dense_intermediate = 512;
  s.vocab = 512;
  s.kda_heads = 4;
  s.kda_head_dim = 32;
  s.mla_heads = 4;
  return s;
}

namespace {
// The folders temp_dir made in this process. Each ctest test is a process of its own, so nothing
// outlives it but the shared models: when its tests passed, its folders go at the end (the whole
// suite's scratch once filled a CI machine's small disk: models of the release's widths, caches,
// snapshots, made by 800 tests and left behind); when one failed, they stay to be read.
std::mutex g_made_mutex;
std::vector<std::string>& made_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

class RemoveTempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed() ||
        std::getenv("DELTAFIN_TEST_KEEP") != nullptr)
      return;
    const std::lock_guard<std::mutex> lock(g_made_mutex);
    for (const std::string& dir : made_dirs()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    made_dirs().clear();
  }
};
[[maybe_unused]] ::testing::Environment* const g_remove_temp_dirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);
}  // namespace

std::string temp_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  namespace fs = std::filesystem;
  fs::path p = fs::path(DELTAFIN_TEST_TMP) /
               (name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  const std::lock_guard<std::mutex> lock(g_made_mutex);
  made_dirs().push_back(p.string());
  return p.string();
}

namespace {
// Each test process has a cache folder of its own (the unpacked demo, heat counts, prefix
// snapshots), removed when it exits: a test never continues another test's kept snapshots.
const bool g_own_cache = [] {
  if (std::getenv("DELTAFIN_CACHE") != nullptr) return false;
  static const std::string dir = temp_dir("cache");
  ::setenv("DELTAFIN_CACHE", dir.c_str(), 1);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  });
  return true;
}();
}  // namespace

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
}

RunResult run_deltafin(const std::vector<std::string>& args, const std::string& stdin_data,
                       double timeout_s) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe(in_pipe) || pipe(out_pipe) || pipe(err_pipe)) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
    posix_spawn_file_actions_addclose(&fa, fd);
  }
  std::vector<std::string> full = {binary()};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, full[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) throw std::runtime_error("cannot spawn " + full[0]);

  RunResult r;
  size_t written = 0;
  if (stdin_data.empty()) {
    close(in_pipe[1]);
    in_pipe[1] = -1;
  } else {
    fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool out_open = true, err_open = true;
  signal(SIGPIPE, SIG_IGN);
  while (out_open || err_open) {
    std::vector<pollfd> fds;
    if (out_open) fds.push_back({out_pipe[0], POLLIN, 0});
    if (err_open) fds.push_back({err_pipe[0], POLLIN, 0});
    if (in_pipe[1] >= 0) fds.push_back({in_pipe[1], POLLOUT, 0});
    int n = poll(fds.data(), fds.size(), 100);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      break;
    }
    if (n <= 0) continue;
    for (auto& p : fds) {
      if (p.revents == 0) continue;
      if (p.fd == in_pipe[1]) {
        ssize_t w = write(in_pipe[1], stdin_data.data() + written, stdin_data.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 || written == stdin_data.size()) {
          close(in_pipe[1]);
          in_pipe[1] = -1;
        }
        continue;
      }
      char buf[65536];
      ssize_t got = read(p.fd, buf, sizeof buf);
      if (got <= 0) {
        if (p.fd == out_pipe[0])
          out_open = false;
        else
          err_open = false;
      } else {
        (p.fd == out_pipe[0] ? r.out : r.err).append(buf, static_cast<size_t>(got));
      }
    }
  }
  if (in_pipe[1] >= 0) close(in_pipe[1]);
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

Child::Child(const std::vector<std::string>& args, bool with_stdin) {
  int out_pipe[2], err_pipe[2], in_pipe[2] = {-1, -1};
  if (pipe(out_pipe) || pipe(err_pipe)) throw std::runtime_error("pipe failed");
  if (with_stdin && pipe2(in_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (with_stdin)
    posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
    posix_spawn_file_actions_addclose(&fa, fd);
  std::vector<std::string> full = {binary()};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int rc = posix_spawn(&pid_, full[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (with_stdin) close(in_pipe[0]);
  in_ = in_pipe[1];
  out_ = out_pipe[0];
  err_ = err_pipe[0];
  if (rc != 0) throw std::runtime_error("cannot spawn " + full[0]);
}

void Child::write_stdin(const std::string& data) {
  size_t done = 0;
  while (in_ >= 0 && done < data.size()) {
    const ssize_t n = ::write(in_, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

Child::~Child() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) close(out_);
  if (err_ >= 0) close(err_);
  if (in_ >= 0) close(in_);
}

void Child::pump(double timeout_s, const std::function<bool()>& done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done() && std::chrono::steady_clock::now() < deadline && (out_ >= 0 || err_ >= 0)) {
    std::vector<pollfd> fds;
    if (out_ >= 0) fds.push_back({out_, POLLIN, 0});
    if (err_ >= 0) fds.push_back({err_, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 50) <= 0) continue;
    for (auto& p : fds) {
      if (p.revents == 0) continue;
      char buf[65536];
      ssize_t got = read(p.fd, buf, sizeof buf);
      if (got <= 0) {
        close(p.fd);
        (p.fd == out_ ? out_ : err_) = -1;
      } else {
        (p.fd == out_ ? r_.out : r_.err).append(buf, static_cast<size_t>(got));
      }
    }
  }
}

std::string Child::wait_stdout(const std::string& needle, double timeout_s) {
  pump(timeout_s, [&] { return r_.out.find(needle) != std::string::npos; });
  return r_.out;
}

std::string Child::wait_stderr(const std::string& needle, double timeout_s, size_t from) {
  pump(timeout_s, [&] { return r_.err.find(needle, from) != std::string::npos; });
  return r_.err;
}

void Child::signal(int sig) {
  kill(pid_, sig);
}

RunResult Child::wait(double timeout_s) {
  pump(timeout_s, [] { return false; });
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  exited_ = true;
  r_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r_;
}

const std::string& demo_model_dir() {
  static const std::string dir = [] {
    const std::string cache = temp_dir("demo-cache");
    RunResult r;
    {
      const ScopedEnv own_cache("DELTAFIN_CACHE", cache.c_str());
      const ScopedEnv no_model("DELTAFIN_MODEL", nullptr);
      r = run_deltafin({"run", "--prompt", "A", "--max-new", "1"});
    }
    if (r.exit_code != 0) ADD_FAILURE() << "installing the demo failed: " << r.err;
    return cache + "/demo-k3-english";
  }();
  return dir;
}

std::string shared_model(const std::vector<std::string>& make_model_args) {
  namespace fs = std::filesystem;
  // The binary's identity: a rebuild gets a folder of its own, and the folders of older builds
  // (made here, by this function) are removed when a new one is made.
  const auto built = fs::last_write_time(binary()).time_since_epoch().count();
  const fs::path root = fs::path(DELTAFIN_TEST_TMP) / "shared-models";
  const fs::path generation = root / std::to_string(built);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the arguments, each ended by a 0 byte
  for (const std::string& a : make_model_args) {
    for (const char c : a) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h *= 1099511628211ull;
  }
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  const fs::path dir = generation / name;
  if (fs::exists(dir)) return dir.string();  // complete: it appears only by the rename below
  std::error_code ec;
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path() != generation) fs::remove_all(e.path(), ec);
  fs::create_directories(generation);
  static std::atomic<int> counter{0};
  const fs::path mine = generation / (std::string(".making-") + std::to_string(::getpid()) + "-" +
                                      std::to_string(counter++));
  fs::remove_all(mine, ec);
  std::vector<std::string> args = {"make-model", mine.string()};
  args.insert(args.end(), make_model_args.begin(), make_model_args.end());
  const RunResult r = run_deltafin(args);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "make-model failed: " << r.err;
    fs::remove_all(mine, ec);
    return mine.string();
  }
  fs::rename(mine, dir, ec);  // fails where another process's copy is already in place
  if (ec) fs::remove_all(mine, ec);
  return dir.string();
}

}  // namespace deltafin::test
