// `deltafin serve` as a child process for the load tools under bench/load (serve_load, soak):
// started on a free loopback port (`--port 0`), its stderr in a file read for the port and the
// "ready:" line, SIGTERM at the end; and the tiny model they make when given none. Header-only:
// each tool is one program.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/synthetic.h"

extern char** environ;

namespace deltafin::bench {

struct ServeChild {
  pid_t pid = -1;
  int port = -1;
  std::string log;

  // Runs `deltafin serve --model MODEL --port 0 ARGS...`; exits the tool when it cannot start.
  ServeChild(const std::string& deltafin, const std::string& model,
             const std::vector<std::string>& extra, const std::string& tag) {
    log =
        (std::filesystem::temp_directory_path() / fmt::format("{}-{}.log", tag, getpid())).string();
    std::vector<std::string> args = {deltafin, "serve", "--model", model, "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start %s\n", args[0].c_str());
      std::exit(1);
    }
    posix_spawn_file_actions_destroy(&fa);
    const std::string listening = "listening on http://127.0.0.1:";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string text = read_log();
      const size_t at = text.find(listening);
      if (text.find("ready:") != std::string::npos && at != std::string::npos) {
        port = std::atoi(text.c_str() + at + listening.size());
        return;
      }
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        std::fprintf(stderr, "the server exited:\n%s\n", text.c_str());
        std::exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "the server did not become ready (log: %s)\n", log.c_str());
    std::exit(1);
  }
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  std::string read_log() const {
    std::string text;
    if (std::FILE* f = std::fopen(log.c_str(), "r")) {
      char buf[4096];
      while (size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
      std::fclose(f);
    }
    return text;
  }

  // SIGTERM and wait; returns the exit status (128 + signal when killed by one).
  int stop() {
    if (pid < 0) return exit_code;
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return exit_code;
  }
  ~ServeChild() {
    stop();
    std::filesystem::remove(log);
  }

 private:
  int exit_code = -1;
};

// Without --model the tools use the tiny synthetic model, made in a temporary folder (`tag`)
// and removed again when this goes away.
struct TinyModelIfNone {
  std::string made;
  TinyModelIfNone(std::string& model, const std::string& tag) {
    if (!model.empty()) return;
    made = (std::filesystem::temp_directory_path() / fmt::format("{}-{}", tag, getpid())).string();
    std::filesystem::remove_all(made);
    make_model(made, synthetic_preset("tiny"));
    model = made;
  }
  TinyModelIfNone(const TinyModelIfNone&) = delete;
  TinyModelIfNone& operator=(const TinyModelIfNone&) = delete;
  ~TinyModelIfNone() {
    if (!made.empty()) std::filesystem::remove_all(made);
  }
};

}  // namespace deltafin::bench
