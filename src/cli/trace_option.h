// `--trace FILE` of run, chat, bench and serve (core/trace.h, docs/TRACING.md). A header of its
// own rather than cli/common.h: only the four commands that trace include it.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <utility>

#include "cli/common.h"

namespace deltafin::cli {

// Adds --trace FILE: the command's timeline in the Trace Event Format.
void add_trace_option(CLI::App* cmd, std::string& path);

// A command's trace: started by the constructor (the file is created then, so a path that cannot
// be written fails before any work; "" traces nothing) and written by finish(). A command that
// fails leaves no trace file: the destructor removes the temporary.
class TraceSession {
 public:
  explicit TraceSession(const std::string& path);
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;
  void finish();  // writes the file and says so on stderr; throws IoError when it cannot

 private:
  std::string path_;
  bool open_ = false;
};

// A command that runs the engine and can trace it (run, chat, serve, bench): the subcommand with
// the engine options and --trace, and its arguments (`Args` holds `engine`, EngineOptions, and
// `trace`), whose callback runs `run(args)` inside a TraceSession. Returns both, for the
// command's own options.
template <typename Args>
std::pair<CLI::App*, std::shared_ptr<Args>> add_traced_engine_command(
    CLI::App& app, const std::string& name, const std::string& description, void (*run)(Args&)) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(name, description);
  add_engine_options(cmd, args->engine);
  add_trace_option(cmd, args->trace);
  cmd->callback([args, run] {
    TraceSession trace(args->trace);
    run(*args);
    trace.finish();
  });
  return {cmd, args};
}

}  // namespace deltafin::cli
